// The tokenizer of a GGUF file (see headlight/load/gguf_tokenizer.h).

#include "headlight/load/gguf_tokenizer.h"

#include <set>
#include <string>

#include "headlight/core/error.h"

namespace headlight::load {

namespace {

const std::set<std::string>& llama3_family() {
  static const std::set<std::string> names = {"llama3",       "llama-v3", "llama-bpe", "falcon3",
                                              "falcon-h1",    "pixtral",  "midm-2.0",  "lfm2",
                                              "jina-v5-nano", "dbrx",     "smaug-bpe"};
  return names;
}

// Pre-tokenisers with patterns of their own that headlight does not have yet.
const std::set<std::string>& not_yet() {
  static const std::set<std::string> names = {"qwen2",  "deepseek-r1-qwen", "kormo",  "f2llmv2",
                                              "megrez", "qwen35",           "tekken", "gpt-4o",
                                              "llama4", "kanana2",          "talkie", "minimax-m2"};
  return names;
}

const io::GgufValue& required(const io::GgufFile& f, const std::string& key) {
  const io::GgufValue* v = f.value(key);
  check(v != nullptr, "{}: metadata \"{}\" is missing", f.path(), key);
  return *v;
}

std::vector<std::string> strings(const io::GgufFile& f, const std::string& key) {
  const io::GgufValue& v = required(f, key);
  check(v.type == io::GgufValueType::array && v.element_type == io::GgufValueType::string,
        "{}: metadata \"{}\" must be an array of strings", f.path(), key);
  std::vector<std::string> out;
  out.reserve(v.items.size());
  for (const io::GgufValue& s : v.items) out.push_back(s.s);
  return out;
}

}  // namespace

model::ByteLevelBpeSpec tokenizer_spec_from_gguf(const io::GgufFile& f) {
  const std::string& path = f.path();
  const std::string kind = required(f, "tokenizer.ggml.model").as_string("tokenizer.ggml.model");
  check(kind == "gpt2",
        "{}: tokenizer.ggml.model \"{}\" is not supported (byte-level BPE, \"gpt2\", is)", path,
        kind);
  model::ByteLevelBpeSpec spec;
  spec.tokens = strings(f, "tokenizer.ggml.tokens");
  for (const std::string& m : strings(f, "tokenizer.ggml.merges")) {
    const size_t space = m.find(' ');
    check(space != std::string::npos, "{}: tokenizer.ggml.merges entry \"{}\" is not a pair", path,
          m);
    spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  if (const io::GgufValue* pre = f.value("tokenizer.ggml.pre")) {
    const std::string& name = pre->as_string("tokenizer.ggml.pre");
    check(not_yet().count(name) == 0,
          "{}: tokenizer.ggml.pre \"{}\": that pre-tokeniser's pattern is not supported yet", path,
          name);
    if (llama3_family().count(name)) spec.pattern = model::kLlama3Pattern;
  }
  if (const io::GgufValue* types = f.value("tokenizer.ggml.token_type")) {
    check(types->type == io::GgufValueType::array && types->items.size() == spec.tokens.size(),
          "{}: tokenizer.ggml.token_type must give one type per token ({})", path,
          spec.tokens.size());
    for (size_t id = 0; id < spec.tokens.size(); ++id) {
      const int64_t t = types->items[id].as_int("tokenizer.ggml.token_type");
      if (t == 3 && model::ByteLevelBpeTokenizer::byte_level_spelled(spec.tokens[id]))  // control
        spec.added.push_back({.id = static_cast<int32_t>(id), .special = true});
      else if (t == 4)  // user-defined
        spec.added.push_back({.id = static_cast<int32_t>(id), .special = false});
    }
  }
  const io::GgufValue* bos = f.value("tokenizer.ggml.add_bos_token");
  if (bos && bos->as_int("tokenizer.ggml.add_bos_token") != 0) {
    const int64_t id =
        required(f, "tokenizer.ggml.bos_token_id").as_int("tokenizer.ggml.bos_token_id");
    spec.prefix.push_back(static_cast<int32_t>(id));
  }
  return spec;
}

model::ByteLevelBpeTokenizer tokenizer_from_gguf(const io::GgufFile& f) {
  return model::ByteLevelBpeTokenizer::from_spec(tokenizer_spec_from_gguf(f), f.path());
}

}  // namespace headlight::load

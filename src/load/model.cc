// load_model: which reader a path needs (see headlight/load/model.h).

#include "headlight/load/model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <map>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "headlight/core/read_file.h"
#include "headlight/io/gguf.h"
#include "headlight/io/safetensors.h"
#include "headlight/load/gguf_tokenizer.h"
#include "headlight/model/byte_bpe.h"
#include "headlight/train/checkpoint.h"
#include "src/load/loaders.h"

namespace headlight::load {

const char* format_name(Format f) {
  switch (f) {
    case Format::checkpoint:
      return "headlight checkpoint";
    case Format::hf_folder:
      return "Hugging Face folder";
    case Format::gguf:
      return "GGUF";
  }
  return "?";
}

const char* pooling_name(Pooling::Mode m) {
  switch (m) {
    case Pooling::Mode::none:
      return "none";
    case Pooling::Mode::cls:
      return "cls";
    case Pooling::Mode::mean:
      return "mean";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

// A loaded model's tokenizer as tokenizer.json text: the folder's file, or made from the GGUF
// metadata, or the one a checkpoint carries.
std::string tokenizer_json_of(const Model& m) {
  switch (m.format) {
    case Format::hf_folder:
      return read_file((fs::path(m.path) / "tokenizer.json").string());
    case Format::gguf:
      return model::to_hf_json(tokenizer_spec_from_gguf(io::GgufFile(m.path)));
    case Format::checkpoint: {
      const auto json = io::SafetensorsFile(m.path).metadata("headlight.hf_tokenizer");
      check(json.has_value(), "{}: no tokenizer JSON to carry over", m.path);
      return *json;
    }
  }
  return {};
}

Pooling::Mode parse_pooling(const std::string& name, const std::string& what) {
  for (auto mode : {Pooling::Mode::none, Pooling::Mode::cls, Pooling::Mode::mean})
    if (name == pooling_name(mode)) return mode;
  fail("{}: headlight.source: pooling \"{}\" is not none, cls or mean", what, name);
}

// What write_model records of a real model (see model.h).
void read_source_metadata(const io::SafetensorsFile& file, Model& m) {
  if (const auto tok = file.metadata("headlight.hf_tokenizer")) {
    m.tokenizer = model::TextTokenizer::from_hf_json(*tok, m.path + ": headlight.hf_tokenizer");
    check(m.tokenizer->vocab_size() <= m.net.config().vocab_size,
          "{}: headlight.hf_tokenizer has {} tokens, more than the model's vocab_size {}", m.path,
          m.tokenizer->vocab_size(), m.net.config().vocab_size);
  }
  const auto source = file.metadata("headlight.source");
  if (!source) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*source);
    m.architecture = j.at("architecture").get<std::string>();
    m.pooling.mode = parse_pooling(j.at("pooling").get<std::string>(), m.path);
    m.pooling.normalize = j.at("normalize").get<bool>();
    m.max_seq_length = std::min(j.at("max_seq_length").get<int64_t>(), m.net.config().block_size);
    m.chat_template = j.at("chat_template").get<std::string>();
    m.eos_ids = j.at("eos_ids").get<std::vector<int32_t>>();
    m.bos_id = j.at("bos_id").get<int32_t>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: headlight.source: {}", m.path, e.what());
  }
}

}  // namespace

Model load_model(const std::string& path) {
  check(fs::exists(path), "{}: no such file or folder", path);
  if (fs::is_directory(path)) return load_hf_folder(path);
  if (path.ends_with(".gguf") || starts_with_gguf_magic(path)) return load_gguf(path);
  // A safetensors file: headlight's checkpoint, or the weights of a Hugging Face folder.
  {
    // (A folder headlight wrote holds a checkpoint without a tokenizer beside config.json.)
    const io::SafetensorsFile file(path);
    if (!file.metadata("headlight.tokenizer").has_value() &&
        !file.metadata("headlight.source").has_value() &&
        fs::exists(fs::path(path).parent_path() / "config.json"))
      return load_hf_folder(fs::path(path).parent_path().string());
  }
  train::LoadedModel loaded = train::load_model(path);
  Model m{.path = path,
          .format = Format::checkpoint,
          .architecture = "headlight",
          .net = std::move(loaded.model)};
  if (loaded.tokenizer) m.tokenizer = model::TextTokenizer(std::move(*loaded.tokenizer));
  m.max_seq_length = m.net.config().block_size;
  const io::SafetensorsFile file(path);
  read_source_metadata(file, m);
  m.stored_dtypes = stored_dtypes(file, m.net);
  return m;
}

std::vector<std::pair<std::string, int64_t>> stored_dtypes(const TensorSource& source,
                                                           const model::GPT& net) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const model::ParameterEntry& e : net.layout().entries()) {
    const std::string type = source.stored_dtype(e.name);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == type; });
    if (it == out.end()) it = out.insert(out.end(), {type, 0});
    it->second += e.numel;
  }
  return out;
}

void write_model(const Model& source, const model::GPT& net, const std::string& path) {
  std::map<std::string, std::string> extra;
  const model::Tokenizer* own = source.tokenizer ? source.tokenizer->own() : nullptr;
  if (source.format == Format::checkpoint && source.architecture == "headlight")
    return train::save_model(path, net, own);
  if (source.tokenizer) {
    if (own == nullptr) extra["headlight.hf_tokenizer"] = tokenizer_json_of(source);
  }
  nlohmann::ordered_json j;
  j["architecture"] = source.architecture;
  j["read_from"] = format_name(source.format);
  j["pooling"] = pooling_name(source.pooling.mode);
  j["normalize"] = source.pooling.normalize;
  j["max_seq_length"] = source.max_seq_length;
  j["chat_template"] = source.chat_template;
  j["eos_ids"] = source.eos_ids;
  j["bos_id"] = source.bos_id;
  extra["headlight.source"] = j.dump();
  train::save_model(path, net, own, extra);
}

}  // namespace headlight::load

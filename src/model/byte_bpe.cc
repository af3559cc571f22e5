// Byte-level BPE (see headlight/model/byte_bpe.h).

#define PCRE2_CODE_UNIT_WIDTH 8
#include "headlight/model/byte_bpe.h"

#include <pcre2.h>

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "src/model/hf_tokenizer.h"
#include "src/model/unicode.h"

namespace headlight::model {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;

// GPT-2's table: printable bytes stand for themselves, the others for characters from U+0100 up.
std::vector<char32_t> byte_to_char() {
  std::vector<char32_t> table(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? static_cast<char32_t>(b) : next++;
  return table;
}

}  // namespace

struct ByteLevelBpeTokenizer::Pattern {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  Pattern(const std::string& pattern, const std::string& what) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      fail("{}: the pre-tokeniser pattern does not compile at {}: {}", what, at,
           reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
    match = pcre2_match_data_create_from_pattern(code, nullptr);
  }
  ~Pattern() {
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
  // Calls chunk(begin, end) for every match of `text` and every gap between matches, in order.
  template <typename Fn>
  void split(std::string_view text, Fn&& chunk) const {
    size_t at = 0, done = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (at <= text.size()) {
      const int rc = pcre2_match(code, subject, text.size(), at, 0, match, nullptr);
      if (rc < 0) break;  // no more matches (or an error: the rest is one gap)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
      const size_t b = ov[0], e = ov[1];
      if (b > done) chunk(done, b);
      if (e > b) chunk(b, e);
      done = std::max(done, e);
      at = e > b ? e : e + 1;  // an empty match: move on by one byte
    }
    if (done < text.size()) chunk(done, text.size());
  }
};

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer() = default;
ByteLevelBpeTokenizer::~ByteLevelBpeTokenizer() = default;
ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(ByteLevelBpeTokenizer&&) noexcept = default;
ByteLevelBpeTokenizer& ByteLevelBpeTokenizer::operator=(ByteLevelBpeTokenizer&&) noexcept = default;

ByteLevelBpeTokenizer ByteLevelBpeTokenizer::from_spec(ByteLevelBpeSpec spec,
                                                       const std::string& what) {
  ByteLevelBpeTokenizer t;
  t.tokens_ = std::move(spec.tokens);
  check(!t.tokens_.empty(), "{}: an empty vocabulary", what);
  for (size_t id = 0; id < t.tokens_.size(); ++id) {
    check(!t.tokens_[id].empty(), "{}: the vocabulary has no token with id {}", what, id);
    check(t.ids_.emplace(t.tokens_[id], static_cast<int32_t>(id)).second,
          "{}: token \"{}\" appears twice in the vocabulary", what, t.tokens_[id]);
  }
  int32_t rank = 0;
  for (auto& [left, right] : spec.merges) t.ranks_.emplace(left + " " + right, rank++);
  for (const ByteLevelBpeSpec::Added& a : spec.added) {
    const std::string& text = t.token(a.id);
    t.added_.push_back(text);
    if (a.special) t.special_.push_back(text);
  }
  for (const std::vector<int32_t>* list : {&spec.prefix, &spec.suffix})
    for (int32_t id : *list) t.token(id);  // throws when outside the vocabulary
  t.prefix_ = std::move(spec.prefix);
  t.suffix_ = std::move(spec.suffix);
  t.split_digits_ = spec.split_digits;
  t.ignore_merges_ = spec.ignore_merges;
  t.pattern_ = std::make_unique<Pattern>(spec.pattern, what);
  const std::vector<char32_t> table = byte_to_char();
  t.byte_chars_.resize(256);
  for (int b = 0; b < 256; ++b) {
    unicode::append(t.byte_chars_[b], table[b]);
    t.char_bytes_[table[b]] = static_cast<uint8_t>(b);
  }
  return t;
}

std::string to_hf_json(const ByteLevelBpeSpec& spec) {
  // Added tokens are in the vocabulary too (the library numbers those that are not after it).
  json vocab = json::object(), merges = json::array(), added = json::array();
  for (const auto& a : spec.added) {
    added.push_back({{"id", a.id},
                     {"content", spec.tokens.at(static_cast<size_t>(a.id))},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", a.special}});
  }
  for (size_t id = 0; id < spec.tokens.size(); ++id)
    vocab[spec.tokens[id]] = static_cast<int32_t>(id);
  for (const auto& [l, r] : spec.merges) merges.push_back({l, r});
  json steps = json::array();
  if (spec.split_digits) steps.push_back({{"type", "Digits"}, {"individual_digits", true}});
  steps.push_back({{"type", "Split"},
                   {"pattern", {{"Regex", spec.pattern}}},
                   {"behavior", "Isolated"},
                   {"invert", false}});
  steps.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}});
  json single = json::array(), specials = json::object();
  auto special = [&](int32_t id) {
    const std::string& t = spec.tokens.at(static_cast<size_t>(id));
    single.push_back({{"SpecialToken", {{"id", t}, {"type_id", 0}}}});
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
  };
  for (int32_t id : spec.prefix) special(id);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (int32_t id : spec.suffix) special(id);
  const json j = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", steps}}},
                  {"post_processor",
                   {{"type", "TemplateProcessing"},
                    {"single", single},
                    {"pair", single},
                    {"special_tokens", specials}}},
                  {"decoder",
                   {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}}},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", spec.ignore_merges},
                    {"vocab", vocab},
                    {"merges", merges}}}};
  return j.dump();
}

ByteLevelBpeTokenizer ByteLevelBpeTokenizer::from_hf_json(const std::string& text,
                                                          const std::string& what) {
  const json j = hf::parse(text, what);
  ByteLevelBpeSpec spec;
  check(j.contains("model") && j["model"].is_object(), "{}: no \"model\"", what);
  const json& model = j["model"];
  const std::string type = model.value("type", "");
  check(type == "BPE", "{}: model.type is \"{}\", not BPE", what, type);
  check(model.contains("vocab") && model["vocab"].is_object() && !model["vocab"].empty(),
        "{}: model.vocab must be a non-empty object", what);
  auto place = [&](int32_t id, const std::string& token) {
    if (static_cast<size_t>(id) >= spec.tokens.size())
      spec.tokens.resize(static_cast<size_t>(id) + 1);
    check(spec.tokens[static_cast<size_t>(id)].empty() ||
              spec.tokens[static_cast<size_t>(id)] == token,
          "{}: id {} names both \"{}\" and \"{}\"", what, id, spec.tokens[static_cast<size_t>(id)],
          token);
    spec.tokens[static_cast<size_t>(id)] = token;
  };
  for (const auto& [token, id_json] : model["vocab"].items())
    place(hf::token_id(id_json, what), token);
  spec.ignore_merges = model.value("ignore_merges", false);
  check(!model.contains("dropout") || model["dropout"].is_null(),
        "{}: BPE dropout is not supported", what);
  check(model.value("continuing_subword_prefix", std::string()).empty() &&
            model.value("end_of_word_suffix", std::string()).empty(),
        "{}: BPE with a subword prefix or suffix is not byte-level", what);
  check(model.contains("merges") && model["merges"].is_array(), "{}: model.merges is missing",
        what);
  for (const json& m : model["merges"]) {
    if (m.is_string()) {  // "left right"
      const std::string pair = m.get<std::string>();
      const size_t space = pair.find(' ');
      check(space != std::string::npos, "{}: model.merges[{}] is not a pair", what,
            spec.merges.size());
      spec.merges.emplace_back(pair.substr(0, space), pair.substr(space + 1));
    } else {
      check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
            "{}: model.merges[{}] must be a pair of strings", what, spec.merges.size());
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      const std::string content = a.value("content", "");
      const int32_t id = hf::token_id(a.value("id", json(-1)), what);
      check(!content.empty() && !a.value("lstrip", false) && !a.value("rstrip", false) &&
                !a.value("single_word", false) && !a.value("normalized", false),
            "{}: added token \"{}\": only tokens matched as they are (no lstrip, rstrip, "
            "single_word or normalized) are supported",
            what, content);
      place(id, content);
      spec.added.push_back({.id = id, .special = a.value("special", false)});
    }
  }
  check(!j.contains("normalizer") || j["normalizer"].is_null(),
        "{}: a normalizer before byte-level BPE is not supported", what);

  // The pre-tokeniser: ByteLevel (GPT-2's pattern), optionally after Digits, or a Split pattern
  // followed by ByteLevel without its own pattern.
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    for (const json& s : pre.value("pretokenizers", json::array())) steps.push_back(s);
  } else if (pre.is_object()) {
    steps.push_back(pre);
  }
  bool byte_level = false, custom = false;
  for (const json& s : steps) {
    const std::string kind = s.value("type", "");
    if (kind == "ByteLevel") {
      check(!s.value("add_prefix_space", false), "{}: ByteLevel add_prefix_space is not supported",
            what);
      byte_level = true;
      if (!s.value("use_regex", true)) check(custom, "{}: ByteLevel without a pattern", what);
    } else if (kind == "Digits") {
      check(s.value("individual_digits", false), "{}: Digits must be individual_digits", what);
      spec.split_digits = true;
    } else if (kind == "Split") {
      check(s.contains("pattern") && s["pattern"].contains("Regex") &&
                s.value("behavior", "") == "Isolated" && !s.value("invert", false),
            "{}: only a Split with a Regex pattern, Isolated and not inverted is supported", what);
      spec.pattern = s["pattern"]["Regex"].get<std::string>();
      custom = true;
    } else {
      fail("{}: pre_tokenizer {} is not supported with byte-level BPE", what, kind);
    }
  }
  check(byte_level, "{}: pre_tokenizer must include ByteLevel", what);

  hf::template_tokens(
      j.contains("post_processor") ? j["post_processor"] : json(),
      [&](const std::string& tok) {
        const auto it = std::find(spec.tokens.begin(), spec.tokens.end(), tok);
        return it == spec.tokens.end() ? -1 : static_cast<int32_t>(it - spec.tokens.begin());
      },
      what, spec.prefix, spec.suffix);
  return from_spec(std::move(spec), what);
}

const std::string& ByteLevelBpeTokenizer::token(int32_t id) const {
  check(id >= 0 && static_cast<size_t>(id) < tokens_.size(), "token id {} is outside [0, {})", id,
        tokens_.size());
  return tokens_[static_cast<size_t>(id)];
}

bool ByteLevelBpeTokenizer::byte_level_spelled(std::string_view token) {
  static const std::vector<char32_t> table = byte_to_char();
  for (char32_t c : unicode::decode(token))
    if (std::find(table.begin(), table.end(), c) == table.end()) return false;
  return true;
}

int32_t ByteLevelBpeTokenizer::id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text,
                                                   bool add_special_tokens) const {
  std::vector<int32_t> out;
  if (add_special_tokens) out = prefix_;
  hf::split_added(
      text, added_, [&](std::string_view plain) { encode_normal(plain, out); },
      [&](size_t k) { out.push_back(id(added_[k])); });
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

void ByteLevelBpeTokenizer::encode_normal(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  auto by_pattern = [&](std::string_view piece) {
    pattern_->split(piece, [&](size_t b, size_t e) { encode_chunk(piece.substr(b, e - b), out); });
  };
  if (!split_digits_) {
    by_pattern(text);
    return;
  }
  // Digits (individual): every numeric character is a piece of its own.
  const std::vector<char32_t> chars = unicode::decode(text);
  std::string run;
  for (char32_t c : chars) {
    if (unicode::category(c) == unicode::Category::number) {
      by_pattern(run);
      run.clear();
      std::string digit;
      unicode::append(digit, c);
      by_pattern(digit);
    } else {
      unicode::append(run, c);
    }
  }
  by_pattern(run);
}

void ByteLevelBpeTokenizer::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  if (chunk.empty()) return;
  std::vector<std::string> symbols;
  symbols.reserve(chunk.size());
  std::string whole;
  for (unsigned char b : chunk) {
    symbols.push_back(byte_chars_[b]);
    whole += byte_chars_[b];
  }
  if (ignore_merges_) {
    if (const int32_t w = id(whole); w >= 0) {
      out.push_back(w);
      return;
    }
  }
  // Merge the pair of lowest rank (the leftmost of equals) until none is a known merge.
  while (symbols.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks_.find(symbols[i] + " " + symbols[i + 1]);
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (const std::string& s : symbols) {
    const int32_t i = id(s);
    check(i >= 0, "byte-level BPE: the piece \"{}\" is not in the vocabulary", s);
    out.push_back(i);
  }
}

std::string ByteLevelBpeTokenizer::token_bytes(int32_t id) const {
  const std::string& tok = token(id);
  if (std::find(added_.begin(), added_.end(), tok) != added_.end()) return tok;
  std::string bytes;
  for (char32_t c : unicode::decode(tok)) {
    const auto it = char_bytes_.find(c);
    if (it != char_bytes_.end()) {
      bytes.push_back(static_cast<char>(it->second));
    } else {
      unicode::append(bytes, c);
    }
  }
  return bytes;
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<int32_t>& ids,
                                          bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t i : ids) {
    const std::string& tok = token(i);
    if (skip_special_tokens && std::find(special_.begin(), special_.end(), tok) != special_.end())
      continue;
    bytes += token_bytes(i);
  }
  return unicode::lossy(bytes);
}

}  // namespace headlight::model

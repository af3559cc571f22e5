// WordPiece (see headlight/model/wordpiece.h).

#include "headlight/model/wordpiece.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "src/model/hf_tokenizer.h"
#include "src/model/unicode.h"

namespace headlight::model {

namespace {

using json = nlohmann::json;

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_ascii_punctuation(char32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
         (c >= 0x7B && c <= 0x7E);
}

bool is_bert_whitespace(char32_t c) {
  return c == U'\t' || c == U'\n' || c == U'\r' || unicode::is_whitespace(c);
}

bool is_bert_control(char32_t c) {
  return c != U'\t' && c != U'\n' && c != U'\r' && unicode::is_other(c);
}

const json& field(const json& j, const char* key, const std::string& what, const char* where) {
  check(j.is_object() && j.contains(key), "{}: {} has no \"{}\"", what, where, key);
  return j.at(key);
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::from_hf_json(const std::string& text,
                                                    const std::string& what) {
  const json j = hf::parse(text, what);
  WordPieceTokenizer t;
  const json& model = field(j, "model", what, "the tokenizer");
  const std::string type = model.value("type", "");
  check(type == "WordPiece", "{}: model.type is \"{}\", not WordPiece", what, type);
  const json& vocab = field(model, "vocab", what, "model");
  check(vocab.is_object() && !vocab.empty(), "{}: model.vocab must be a non-empty object", what);
  for (const auto& [token, id_json] : vocab.items()) {
    const int32_t id = hf::token_id(id_json, what);
    if (static_cast<size_t>(id) >= t.tokens_.size()) t.tokens_.resize(static_cast<size_t>(id) + 1);
    check(t.tokens_[static_cast<size_t>(id)].empty() && t.ids_.count(token) == 0,
          "{}: model.vocab: id {} or token \"{}\" appears twice", what, id, token);
    t.tokens_[static_cast<size_t>(id)] = token;
    t.ids_[token] = id;
  }
  for (size_t id = 0; id < t.tokens_.size(); ++id)
    check(!t.tokens_[id].empty(), "{}: model.vocab has no token with id {}", what, id);
  t.continuing_ = model.value("continuing_subword_prefix", "##");
  t.max_chars_ = model.value("max_input_chars_per_word", int64_t{100});
  const std::string unk = field(model, "unk_token", what, "model").get<std::string>();
  t.unk_ = t.id(unk);
  check(t.unk_ >= 0, "{}: model.unk_token \"{}\" is not in the vocabulary", what, unk);

  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      const std::string content = field(a, "content", what, "an added token").get<std::string>();
      const int32_t id = hf::token_id(field(a, "id", what, "an added token"), what);
      check(a.value("special", false) && !a.value("lstrip", false) && !a.value("rstrip", false) &&
                !a.value("single_word", false),
            "{}: added token \"{}\": only special tokens without lstrip, rstrip or single_word "
            "are supported",
            what, content);
      check(t.id(content) == id, "{}: added token \"{}\" (id {}) does not match the vocabulary",
            what, content, id);
      t.special_.push_back(content);
    }
  }

  const json& norm = j.contains("normalizer") ? j["normalizer"] : json();
  if (norm.is_null()) {
    t.clean_text_ = t.chinese_chars_ = t.strip_accents_ = t.lowercase_ = false;
  } else {
    check(norm.value("type", "") == "BertNormalizer",
          "{}: normalizer {} is not supported with WordPiece (BertNormalizer is)", what,
          norm.value("type", "?"));
    t.clean_text_ = norm.value("clean_text", true);
    t.chinese_chars_ = norm.value("handle_chinese_chars", true);
    t.lowercase_ = norm.value("lowercase", true);
    t.strip_accents_ = norm.contains("strip_accents") && !norm["strip_accents"].is_null()
                           ? norm["strip_accents"].get<bool>()
                           : t.lowercase_;
  }
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  check(pre.is_object() && pre.value("type", "") == "BertPreTokenizer",
        "{}: pre_tokenizer must be BertPreTokenizer for WordPiece", what);

  hf::template_tokens(
      j.contains("post_processor") ? j["post_processor"] : json(),
      [&](const std::string& tok) { return t.id(tok); }, what, t.prefix_, t.suffix_);
  const json& dec = j.contains("decoder") ? j["decoder"] : json();
  if (dec.is_object()) t.cleanup_ = dec.value("cleanup", true);
  return t;
}

const std::string& WordPieceTokenizer::token(int32_t id) const {
  check(id >= 0 && static_cast<size_t>(id) < tokens_.size(), "token id {} is outside [0, {})", id,
        tokens_.size());
  return tokens_[static_cast<size_t>(id)];
}

int32_t WordPieceTokenizer::id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> WordPieceTokenizer::encode(std::string_view text,
                                                bool add_special_tokens) const {
  std::vector<int32_t> out;
  if (add_special_tokens) out = prefix_;
  // Special tokens are split out of the raw text first.
  hf::split_added(
      text, special_, [&](std::string_view plain) { encode_normal(plain, out); },
      [&](size_t k) { out.push_back(id(special_[k])); });
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

void WordPieceTokenizer::encode_normal(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  // BertNormalizer, one character at a time (each step is local to a character).
  std::vector<char32_t> norm, tmp, tmp2;
  for (char32_t c : unicode::decode(text)) {
    if (clean_text_) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      if (is_bert_whitespace(c)) c = U' ';
    }
    tmp.clear();
    if (chinese_chars_ && is_chinese_char(c)) {
      tmp = {U' ', c, U' '};
    } else {
      tmp = {c};
    }
    if (strip_accents_) {
      tmp2.clear();
      for (char32_t x : tmp) unicode::decompose(x, tmp2);
      tmp.clear();
      for (char32_t x : tmp2)
        if (unicode::category(x) != unicode::Category::mark_nonspacing) tmp.push_back(x);
    }
    if (lowercase_) {
      tmp2.clear();
      for (char32_t x : tmp) unicode::lowercase(x, tmp2);
      tmp.swap(tmp2);
    }
    norm.insert(norm.end(), tmp.begin(), tmp.end());
  }
  // BertPreTokenizer: words between whitespace, each punctuation character a word of its own.
  std::vector<char32_t> word;
  auto flush = [&] {
    if (!word.empty()) wordpiece(word, out);
    word.clear();
  };
  for (char32_t c : norm) {
    if (unicode::is_whitespace(c)) {
      flush();
    } else if (is_ascii_punctuation(c) || unicode::is_punctuation(c)) {
      flush();
      word = {c};
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
}

void WordPieceTokenizer::wordpiece(const std::vector<char32_t>& word,
                                   std::vector<int32_t>& out) const {
  if (static_cast<int64_t>(word.size()) > max_chars_) {
    out.push_back(unk_);
    return;
  }
  const size_t before = out.size();
  size_t start = 0;
  while (start < word.size()) {
    int32_t found = -1;
    size_t end = word.size();
    for (; end > start; --end) {
      std::string piece = start > 0 ? continuing_ : std::string();
      for (size_t k = start; k < end; ++k) unicode::append(piece, word[k]);
      found = id(piece);
      if (found >= 0) break;
    }
    if (found < 0) {  // the word cannot be covered: one unknown token for all of it
      out.resize(before);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

std::string WordPieceTokenizer::decode(const std::vector<int32_t>& ids,
                                       bool skip_special_tokens) const {
  std::string out;
  bool first = true;
  for (int32_t i : ids) {
    const std::string& tok = token(i);
    if (skip_special_tokens) {
      bool special = false;
      for (const std::string& s : special_) special = special || s == tok;
      if (special) continue;
    }
    std::string piece;
    if (!first && tok.rfind(continuing_, 0) == 0) {
      piece = tok.substr(continuing_.size());
    } else {
      piece = first ? tok : " " + tok;
    }
    first = false;
    if (cleanup_) {
      // The WordPiece decoder's cleanup, piece by piece: no space before . ? ! , and the like.
      static const std::pair<const char*, const char*> kFix[] = {
          {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
          {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
          {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
      for (const auto& [from, to] : kFix)
        for (size_t at = piece.find(from); at != std::string::npos;
             at = piece.find(from, at + std::strlen(to)))
          piece.replace(at, std::strlen(from), to);
    }
    out += piece;
  }
  return out;
}

bool WordPieceTokenizer::is_special(int32_t id) const {
  return std::find(special_.begin(), special_.end(), token(id)) != special_.end();
}

}  // namespace headlight::model

// TextTokenizer (see headlight/load/text_tokenizer.h).

#include "headlight/model/text_tokenizer.h"

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"

namespace headlight::model {

TextTokenizer TextTokenizer::from_hf_json(const std::string& json, const std::string& what) {
  std::string type;
  try {
    const auto j = nlohmann::json::parse(json);
    check(j.is_object() && j.contains("model") && j["model"].is_object() &&
              j["model"].contains("type") && j["model"]["type"].is_string(),
          "{}: no \"model.type\" (not a tokenizers tokenizer.json?)", what);
    type = j["model"]["type"].get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", what, e.what());
  }
  if (type == "WordPiece") return TextTokenizer(WordPieceTokenizer::from_hf_json(json, what));
  if (type == "BPE") return TextTokenizer(ByteLevelBpeTokenizer::from_hf_json(json, what));
  fail("{}: tokenizer model \"{}\" is not supported (supported: WordPiece, byte-level BPE)", what,
       type);
}

std::string TextTokenizer::kind() const {
  if (const auto* t = std::get_if<Tokenizer>(&t_)) return t->is_bpe() ? "bpe" : "byte";
  if (std::holds_alternative<WordPieceTokenizer>(t_)) return "wordpiece";
  return "byte-level BPE";
}

int64_t TextTokenizer::vocab_size() const {
  return std::visit([](const auto& t) { return t.vocab_size(); }, t_);
}

std::vector<int32_t> TextTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const auto* t = std::get_if<Tokenizer>(&t_)) return t->encode(text);
  if (const auto* t = std::get_if<WordPieceTokenizer>(&t_))
    return t->encode(text, add_special_tokens);
  return std::get<ByteLevelBpeTokenizer>(t_).encode(text, add_special_tokens);
}

std::string TextTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  if (const auto* t = std::get_if<Tokenizer>(&t_)) return t->decode(ids);
  const std::vector<int32_t> v(ids.begin(), ids.end());
  if (const auto* t = std::get_if<WordPieceTokenizer>(&t_))
    return t->decode(v, skip_special_tokens);
  return std::get<ByteLevelBpeTokenizer>(t_).decode(v, skip_special_tokens);
}

std::string TextTokenizer::token(int32_t id) const {
  check(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary [0, {})", id,
        vocab_size());
  if (const auto* t = std::get_if<Tokenizer>(&t_)) return t->token_bytes(id);
  if (const auto* t = std::get_if<WordPieceTokenizer>(&t_)) return t->token(id);
  return std::get<ByteLevelBpeTokenizer>(t_).token(id);
}

std::string TextTokenizer::token_bytes(int32_t id) const {
  const std::string t = token(id);  // checks the range
  if (const auto* w = std::get_if<WordPieceTokenizer>(&t_)) {
    if (w->is_special(id)) return t;
    return t.starts_with("##") ? t.substr(2) : " " + t;
  }
  if (const auto* b = std::get_if<ByteLevelBpeTokenizer>(&t_)) return b->token_bytes(id);
  return t;
}

int32_t TextTokenizer::id(const std::string& token) const {
  if (const auto* t = std::get_if<Tokenizer>(&t_)) {
    for (int32_t i = 0; i < t->vocab_size(); ++i)
      if (t->token_bytes(i) == token) return i;
    return -1;
  }
  if (const auto* t = std::get_if<WordPieceTokenizer>(&t_)) return t->id(token);
  return std::get<ByteLevelBpeTokenizer>(t_).id(token);
}

}  // namespace headlight::model

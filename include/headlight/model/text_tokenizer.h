// TextTokenizer: whichever tokenizer a model came with, behind one interface: headlight's own
// (byte-level, or BPE learnt from a corpus), WordPiece (BERT-family tokenizer.json) or byte-level
// BPE (GPT-2, Llama-3, SmolLM: tokenizer.json or GGUF metadata).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "headlight/model/byte_bpe.h"
#include "headlight/model/tokenizer.h"
#include "headlight/model/wordpiece.h"

namespace headlight::model {

class TextTokenizer {
 public:
  explicit TextTokenizer(Tokenizer t) : t_(std::move(t)) {}
  explicit TextTokenizer(WordPieceTokenizer t) : t_(std::move(t)) {}
  explicit TextTokenizer(ByteLevelBpeTokenizer t) : t_(std::move(t)) {}
  // From the text of a Hugging Face tokenizer.json (a WordPiece or a byte-level BPE model); other
  // models are an Error naming `what` and the model type.
  static TextTokenizer from_hf_json(const std::string& json, const std::string& what);

  // "byte", "bpe" (headlight's own), "wordpiece" or "byte-level BPE".
  std::string kind() const;
  int64_t vocab_size() const;
  // Ids as the tokenizer's library gives them (special tokens from its post-processor when
  // add_special_tokens; headlight's own tokenizers have none).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;
  // The vocabulary entry of `id` as the tokenizer spells it ("##ing", "Ġthe", raw bytes).
  std::string token(int32_t id) const;
  // The bytes `id` stands for in text: headlight's and byte-level BPE's exactly (the concatenation
  // over an encoding is the text, special tokens as their own text); WordPiece's as readable text
  // ("##ing" → "ing", a word's first piece after a space, special tokens as they are), which its
  // normalisation (lowercase, accents) keeps from being exact.
  std::string token_bytes(int32_t id) const;
  // Whether token_bytes over an encoding gives back the text exactly (byte offsets map to
  // tokens).
  bool lossless() const { return !std::holds_alternative<WordPieceTokenizer>(t_); }
  // The id of a vocabulary entry, or −1.
  int32_t id(const std::string& token) const;
  // headlight's own tokenizer (what a checkpoint stores), or nullptr.
  const Tokenizer* own() const { return std::get_if<Tokenizer>(&t_); }

 private:
  std::variant<Tokenizer, WordPieceTokenizer, ByteLevelBpeTokenizer> t_;
};

}  // namespace headlight::model

// Tokenizers: byte-level (256 symbols, one per byte; the default) and byte-level BPE, whose merges
// are learnt from a corpus. Both round-trip any bytes: decode(encode(s)) == s. A tokenizer is
// stored as JSON in a checkpoint's metadata ("headlight.tokenizer"), so one file is a whole model.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace headlight::model {

class Tokenizer {
 public:
  // The byte-level tokenizer: token i is byte i.
  static Tokenizer byte_level();
  // Byte-level BPE with vocab_size − 256 merges learnt from `text` (vocab_size ≥ 256). The text is
  // first split into pieces (a run of letters or of digits with at most one leading space, a run
  // of other non-space bytes, a run of spaces, a newline), merges never cross pieces, and each step
  // merges the most frequent adjacent pair (ties: the smaller pair of ids). Stops early when no
  // pair occurs twice.
  static Tokenizer train_bpe(std::string_view text, int64_t vocab_size);
  // From to_json()'s form; throws Error naming the problem.
  static Tokenizer from_json(const std::string& json);
  std::string to_json() const;

  bool is_bpe() const { return !merges_.empty(); }
  int64_t vocab_size() const { return 256 + static_cast<int64_t>(merges_.size()); }
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws Error naming `tokens` on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> tokens) const;
  // The bytes of one token.
  const std::string& token_bytes(int32_t id) const;

 private:
  void rebuild();
  std::vector<std::pair<int32_t, int32_t>> merges_;  // merge i makes token 256 + i
  std::vector<std::string> bytes_;                   // [vocab] the bytes of each token
};

// The pieces BPE works within (see train_bpe), in order; their concatenation is `text`.
std::vector<std::string_view> split_pieces(std::string_view text);

}  // namespace headlight::model

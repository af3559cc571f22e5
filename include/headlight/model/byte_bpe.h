// Byte-level BPE, the tokenizer of GPT-2, Llama-3 and SmolLM models, read from a Hugging Face
// `tokenizer.json` and equal to the `tokenizers` library's encoding (ids for ids, padding off):
//   1. added tokens marked special ("<|im_start|>", …) are split out of the raw text first
//      (leftmost, then longest match) and kept whole;
//   2. the pre-tokeniser: the ByteLevel pattern (GPT-2's, unless a Split step gives another, such
//      as Llama-3's) cuts the text into chunks through PCRE2 (Unicode properties on), optionally
//      after a Digits step that isolates each digit;
//   3. each chunk's bytes map to printable characters (GPT-2's byte-to-unicode table) and are
//      merged pair by pair, always the pair with the lowest merge rank first (with ignore_merges, a
//      chunk that is itself a token is taken whole);
//   4. the post-processor's template may put tokens around the sequence (a BOS token).
// decode maps the characters back to bytes (invalid UTF-8 becomes U+FFFD, as the library does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace headlight::model {

// GPT-2's pre-tokeniser pattern (the ByteLevel default) and Llama-3's (a Split before ByteLevel).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;

// What a byte-level BPE tokenizer is made of, whichever file it comes from.
struct ByteLevelBpeSpec {
  std::vector<std::string> tokens;  // by id, in GPT-2's byte-level characters
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  struct Added {
    int32_t id = 0;
    bool special = true;  // skipped by decode(…, skip_special_tokens = true)
  };
  std::vector<Added> added;  // matched whole in the raw text (their token is their text)
  std::string pattern = kGpt2Pattern;
  bool split_digits = false;  // a Digits step (each digit alone) before the pattern
  bool ignore_merges = false;
  std::vector<int32_t> prefix, suffix;  // put around every sequence (a BOS token)
};

// The spec as a Hugging Face tokenizer.json (BPE model, Split and ByteLevel pre-tokenisers,
// TemplateProcessing for the prefix and suffix) that from_hf_json and the `tokenizers` library
// read back to the same tokenizer: how a model read from a GGUF file keeps its tokenizer when
// headlight writes it.
std::string to_hf_json(const ByteLevelBpeSpec& spec);

class ByteLevelBpeTokenizer {
 public:
  // `what` names the source in errors (a token missing from the vocabulary, a bad pattern).
  static ByteLevelBpeTokenizer from_spec(ByteLevelBpeSpec spec, const std::string& what);
  // From the text of a tokenizer.json whose model is BPE with a ByteLevel pre-tokeniser.
  static ByteLevelBpeTokenizer from_hf_json(const std::string& json, const std::string& what);
  ~ByteLevelBpeTokenizer();
  ByteLevelBpeTokenizer(ByteLevelBpeTokenizer&&) noexcept;
  ByteLevelBpeTokenizer& operator=(ByteLevelBpeTokenizer&&) noexcept;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token(int32_t id) const;
  int32_t id(const std::string& token) const;  // −1 when absent
  // The raw bytes a token stands for (an added token: its text); decode is their concatenation,
  // made valid UTF-8.
  std::string token_bytes(int32_t id) const;
  // Whether every character of `token` is one of GPT-2's byte-level characters (a token a
  // byte-level vocabulary can hold).
  static bool byte_level_spelled(std::string_view token);

 private:
  ByteLevelBpeTokenizer();
  void encode_normal(std::string_view text, std::vector<int32_t>& out) const;
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;

  struct Pattern;  // the compiled pre-tokeniser pattern (PCRE2)
  std::unique_ptr<Pattern> pattern_;
  bool split_digits_ = false;
  bool ignore_merges_ = false;
  std::vector<std::string> tokens_;  // by id (byte-level characters)
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<std::string, int32_t> ranks_;  // "left right" → merge rank
  std::vector<std::string> added_;                  // matched whole in the raw text
  std::vector<std::string> special_;                // those of them decode skips
  std::vector<int32_t> prefix_, suffix_;
  std::vector<std::string> byte_chars_;               // byte → its character (UTF-8)
  std::unordered_map<char32_t, uint8_t> char_bytes_;  // and back
};

}  // namespace headlight::model

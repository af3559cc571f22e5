// WordPiece, the tokenizer of BERT-family models, read from a Hugging Face `tokenizer.json` and
// equal to the `tokenizers` library's encoding (ids for ids) with padding and truncation off:
//   1. added tokens marked special ("[CLS]", "[MASK]", …) are split out of the raw text first
//      (leftmost, then longest match) and kept whole;
//   2. BertNormalizer on the rest: drop NUL, U+FFFD and control characters, turn whitespace into
//      spaces, surround CJK ideographs with spaces, strip accents (NFD, then drop nonspacing marks;
//      on when `strip_accents` is true, or null and `lowercase` is true), lowercase;
//   3. BertPreTokenizer: split on whitespace, and each punctuation character (Unicode P*, or ASCII
//      punctuation such as $ + < = > ^ ` | ~) on its own;
//   4. WordPiece: each word greedily as the longest vocabulary entries from its start, later pieces
//      with the "##" prefix; a word longer than max_input_chars_per_word characters, or one that
//      cannot be covered, is the unknown token;
//   5. the post-processor's template: [CLS] … [SEP].
// decode joins the pieces ("##" pieces onto the one before) and undoes the spaces before
// punctuation as the WordPiece decoder's cleanup does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace headlight::model {

class WordPieceTokenizer {
 public:
  // From the text of a tokenizer.json whose model is WordPiece; `what` names the file in errors
  // (a missing field or another model type is an Error naming it).
  static WordPieceTokenizer from_hf_json(const std::string& json, const std::string& what);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token(int32_t id) const;
  // The id of a token, or −1.
  int32_t id(const std::string& token) const;
  // Whether `id` is an added token marked special ([CLS], [SEP], …).
  bool is_special(int32_t id) const;

 private:
  void encode_normal(std::string_view text, std::vector<int32_t>& out) const;
  void wordpiece(const std::vector<char32_t>& word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // by id
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> special_;      // added tokens marked special, matched in the raw text
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's tokens around a sequence
  int32_t unk_ = -1;
  std::string continuing_ = "##";
  int64_t max_chars_ = 100;
  bool clean_text_ = true, chinese_chars_ = true, strip_accents_ = true, lowercase_ = true;
  bool cleanup_ = true;
};

}  // namespace headlight::model

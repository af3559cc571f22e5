// WordPiece on a small vocabulary: the normaliser's steps, the pre-tokeniser's splits, the greedy
// longest match, the unknown token, special tokens in the text, decoding, and the errors of a
// tokenizer.json it cannot read. python/tests/test_tokenizers.py compares it with Hugging Face
// tokenizers on a real vocabulary and 2,310 lines.

#include "headlight/model/wordpiece.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace headlight::model {
namespace {

using testing::expect_error;

std::string tokenizer_json(const std::string& model_type = "WordPiece") {
  return R"({"added_tokens": [{"id": 0, "content": "[UNK]", "special": true},
                              {"id": 1, "content": "[CLS]", "special": true},
                              {"id": 2, "content": "[SEP]", "special": true},
                              {"id": 3, "content": "[MASK]", "special": true}],
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                   "strip_accents": null, "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}},
                                  {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    "model": {"type": ")" +
         model_type + R"(", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 9,
              "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3, "un": 4, "##aff": 5,
                        "##able": 6, "cafe": 7, ",": 8, "北": 9, "京": 10, "!": 11, "a": 12,
                        "##a": 13, "$": 14}}})";
}

TEST(WordPiece, NormalisesSplitsAndMatchesGreedily) {
  const auto t = WordPieceTokenizer::from_hf_json(tokenizer_json(), "t.json");
  // Lowercase and accents stripped ("CAFÉ" → "cafe"), punctuation split, greedy longest match
  // (un ##aff ##able), CJK characters split, [CLS] … [SEP] around.
  EXPECT_EQ(t.encode("UnAffable, CAFÉ!北京"),
            (std::vector<int32_t>{1, 4, 5, 6, 8, 7, 11, 9, 10, 2}));
  // A word that cannot be covered is one unknown token; one longer than 9 characters too.
  EXPECT_EQ(t.encode("unxyz aaaaaaaaaa aaa", false), (std::vector<int32_t>{0, 0, 12, 13, 13}));
  // Special tokens are split out of the raw text; ASCII punctuation such as $ splits words.
  EXPECT_EQ(t.encode("a[MASK]$a", false), (std::vector<int32_t>{12, 3, 14, 12}));
  // Control characters are dropped, whitespace of any kind separates.
  EXPECT_EQ(t.encode("a\u0007a\ta\u00a0a", false), (std::vector<int32_t>{12, 13, 12, 12}));
}

TEST(WordPiece, DecodesPiecesAndCleansUpPunctuation) {
  const auto t = WordPieceTokenizer::from_hf_json(tokenizer_json(), "t.json");
  EXPECT_EQ(t.decode({1, 4, 5, 6, 8, 7, 11, 2}), "unaffable, cafe!");
  EXPECT_EQ(t.decode({1, 12, 2}, false), "[CLS] a [SEP]");
}

TEST(WordPiece, RefusesWhatItCannotRead) {
  expect_error([] { WordPieceTokenizer::from_hf_json(tokenizer_json("BPE"), "t.json"); },
               {"t.json", "BPE", "not WordPiece"});
  expect_error([] { WordPieceTokenizer::from_hf_json("{", "t.json"); }, {"t.json", "not JSON"});
  expect_error(
      [] { WordPieceTokenizer::from_hf_json(R"({"model": {"type": "WordPiece"}})", "t.json"); },
      {"t.json", "\"vocab\""});
  const auto t = WordPieceTokenizer::from_hf_json(tokenizer_json(), "t.json");
  expect_error([&] { t.decode({99}); }, {"token id 99"});
}

}  // namespace
}  // namespace headlight::model

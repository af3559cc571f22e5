// Byte-level BPE on a small vocabulary: GPT-2's byte-to-character table, the pre-tokeniser's
// chunks, merges by rank, special tokens in the text, decoding back to bytes, and the errors of a
// tokenizer.json it cannot read. python/tests/test_tokenizers.py compares it with Hugging Face
// tokenizers on SmolLM2's vocabulary, several pre-tokenisers and 2,310 lines.

#include "headlight/model/byte_bpe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace headlight::model {
namespace {

using testing::expect_error;

// Every single byte's character (ids 0–255 in byte order) plus merged pieces: "Ġ" is the
// character of the space byte, "Ċ" of the newline.
std::string tokenizer_json(const std::string& pre = R"({"type": "ByteLevel", "use_regex": true})") {
  std::string vocab;
  auto chr = [](int b) -> std::string {
    // GPT-2's table: printable bytes map to themselves, the rest to U+0100 onwards in order.
    static std::vector<std::string> table = [] {
      std::vector<std::string> t(256);
      int next = 256;
      for (int c = 0; c < 256; ++c) {
        const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        const int u = printable ? c : next++;
        std::string s;
        if (u < 0x80) {
          s = std::string(1, static_cast<char>(u));
        } else {
          s = {static_cast<char>(0xC0 | (u >> 6)), static_cast<char>(0x80 | (u & 0x3F))};
        }
        t[c] = s;
      }
      return t;
    }();
    return table[b];
  };
  for (int b = 0; b < 256; ++b) {
    std::string esc = chr(b) == "\"" ? "\\\"" : chr(b) == "\\" ? "\\\\" : chr(b);
    vocab += "\"" + esc + "\": " + std::to_string(b) + ", ";
  }
  vocab +=
      R"("he": 256, "ll": 257, "hell": 258, "hello": 259, "Ġw": 260, "Ġwo": 261, "<|s|>": 262)";
  return R"({"added_tokens": [{"id": 262, "content": "<|s|>", "special": true, "normalized": false}],
    "normalizer": null, "pre_tokenizer": )" +
         pre + R"(, "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {)" +
         vocab + R"(}, "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"]}})";
}

TEST(ByteLevelBpe, ChunksMergesAndSpecialTokens) {
  const auto t = ByteLevelBpeTokenizer::from_hf_json(tokenizer_json(), "t.json");
  // "hello" merges fully; " wor" is one chunk ("Ġwo" then "r"); "!" its own chunk; the special
  // token is split out of the raw text; the newline byte maps to its own character.
  EXPECT_EQ(t.encode("hello wor!<|s|>\n"), (std::vector<int32_t>{259, 261, 'r', '!', 262, 10}));
  EXPECT_EQ(t.decode({259, 261, 'r', '!', 262, 10}), "hello wor!\n");
  EXPECT_EQ(t.decode({259, 262}, false), "hello<|s|>");
  // Bytes that are not valid UTF-8 decode to U+FFFD, once per maximal invalid subsequence.
  EXPECT_EQ(t.decode({0xE2, 0x82, 'a'}),
            "\xEF\xBF\xBD"
            "a");
}

TEST(ByteLevelBpe, RefusesWhatItCannotRead) {
  expect_error(
      [] {
        ByteLevelBpeTokenizer::from_hf_json(tokenizer_json(R"({"type": "Whitespace"})"), "t.json");
      },
      {"t.json", "Whitespace", "not supported"});
  expect_error(
      [] {
        ByteLevelBpeTokenizer::from_hf_json(
            tokenizer_json(
                R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]})"),
            "t.json");
      },
      {"t.json", "pattern does not compile"});
  expect_error(
      [] { ByteLevelBpeTokenizer::from_hf_json(R"({"model": {"type": "WordPiece"}})", "t.json"); },
      {"t.json", "not BPE"});
}

}  // namespace
}  // namespace headlight::model

// Byte-level and BPE tokenizers.

#include "headlight/model/tokenizer.h"

#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"

namespace headlight::model {

namespace {

bool is_letter(unsigned char c) {
  return std::isalpha(c) || c >= 0x80;
}
bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Applies the merges to one piece's bytes: repeatedly merge the adjacent pair of lowest rank.
std::vector<int32_t> encode_piece(std::string_view piece,
                                  const std::unordered_map<uint64_t, int32_t>& rank) {
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  for (unsigned char c : piece) ids.push_back(c);
  while (ids.size() > 1) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const auto it = rank.find(pair_key(ids[i], ids[i + 1]));
      if (it != rank.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    ids[at] = 256 + best;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(at + 1));
  }
  return ids;
}

}  // namespace

std::vector<std::string_view> split_pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t i = 0;
  const size_t n = text.size();
  auto u = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < n) {
    size_t j = i;
    const bool lead_space = u(j) == ' ' && j + 1 < n && (is_letter(u(j + 1)) || is_digit(u(j + 1)));
    if (lead_space) ++j;
    if (is_letter(u(j))) {
      while (j < n && is_letter(u(j))) ++j;
    } else if (is_digit(u(j))) {
      while (j < n && is_digit(u(j))) ++j;
    } else if (is_space(u(j))) {
      while (j < n && is_space(u(j))) ++j;
    } else if (u(j) == '\n') {
      ++j;
    } else {
      while (j < n && !is_letter(u(j)) && !is_digit(u(j)) && !is_space(u(j)) && u(j) != '\n') ++j;
    }
    pieces.push_back(text.substr(i, j - i));
    i = j;
  }
  return pieces;
}

Tokenizer Tokenizer::byte_level() {
  Tokenizer t;
  t.rebuild();
  return t;
}

Tokenizer Tokenizer::train_bpe(std::string_view text, int64_t vocab_size) {
  check(vocab_size >= 256 && vocab_size < (int64_t{1} << 31),
        "vocab: a byte-level BPE vocabulary needs at least 256 tokens, got {}", vocab_size);
  // Unique pieces with their counts, in first-seen order (deterministic).
  std::map<std::string_view, int64_t> counts;
  for (std::string_view p : split_pieces(text)) ++counts[p];
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [piece, count] : counts) {
    std::vector<int32_t> ids;
    for (unsigned char c : piece) ids.push_back(c);
    words.push_back(std::move(ids));
    freq.push_back(count);
  }
  Tokenizer t;
  while (t.vocab_size() < vocab_size) {
    std::unordered_map<uint64_t, int64_t> pairs;
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t i = 0; i + 1 < words[w].size(); ++i)
        pairs[pair_key(words[w][i], words[w][i + 1])] += freq[w];
    uint64_t best = 0;
    int64_t best_count = 1;
    for (const auto& [key, count] : pairs)
      if (count > best_count || (count == best_count && count > 1 && key < best)) {
        best = key;
        best_count = count;
      }
    if (best_count < 2) break;
    const int32_t a = static_cast<int32_t>(best >> 32),
                  b = static_cast<int32_t>(best & 0xffffffffu);
    const int32_t id = static_cast<int32_t>(t.vocab_size());
    t.merges_.emplace_back(a, b);
    for (auto& word : words) {
      size_t out = 0;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
          word[out++] = id;
          ++i;
        } else {
          word[out++] = word[i];
        }
      }
      word.resize(out);
    }
  }
  t.rebuild();
  return t;
}

void Tokenizer::rebuild() {
  bytes_.clear();
  for (int c = 0; c < 256; ++c) bytes_.emplace_back(1, static_cast<char>(c));
  for (const auto& [a, b] : merges_)
    bytes_.push_back(bytes_[static_cast<size_t>(a)] + bytes_[static_cast<size_t>(b)]);
}

std::string Tokenizer::to_json() const {
  nlohmann::json j;
  j["type"] = is_bpe() ? "bpe" : "byte";
  auto merges = nlohmann::json::array();
  for (const auto& [a, b] : merges_) merges.push_back({a, b});
  j["merges"] = merges;
  return j.dump();
}

Tokenizer Tokenizer::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("headlight.tokenizer: not valid JSON ({})", e.what());
  }
  check(j.is_object() && j.contains("type") && j["type"].is_string(),
        "headlight.tokenizer: expected an object with a \"type\"");
  const std::string type = j["type"];
  Tokenizer t;
  if (type == "bpe") {
    check(j.contains("merges") && j["merges"].is_array(),
          "headlight.tokenizer: bpe needs \"merges\"");
    for (const auto& m : j["merges"]) {
      check(m.is_array() && m.size() == 2 && m[0].is_number_integer() && m[1].is_number_integer(),
            "headlight.tokenizer: each merge must be a pair of token ids");
      const int64_t a = m[0], b = m[1], next = t.vocab_size();
      check(a >= 0 && a < next && b >= 0 && b < next,
            "headlight.tokenizer: merge {} refers to a token ({}, {}) not yet defined", next, a, b);
      t.merges_.emplace_back(static_cast<int32_t>(a), static_cast<int32_t>(b));
    }
  } else {
    check(type == "byte", "headlight.tokenizer: unknown type \"{}\" (byte or bpe)", type);
  }
  t.rebuild();
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  if (!is_bpe()) {
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::unordered_map<uint64_t, int32_t> rank;
  for (size_t i = 0; i < merges_.size(); ++i)
    rank.emplace(pair_key(merges_[i].first, merges_[i].second), static_cast<int32_t>(i));
  for (std::string_view piece : split_pieces(text)) {
    const auto part = encode_piece(piece, rank);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  check(id >= 0 && id < vocab_size(), "tokens: id {} is outside the vocabulary [0, {})", id,
        vocab_size());
  return bytes_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string out;
  for (int32_t id : tokens) out += token_bytes(id);
  return out;
}

}  // namespace headlight::model

// Attention capture, statistics, the word view and exports.

#include "headlight/inspect/capture.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"

namespace headlight::inspect {

HeadStats head_stats(const float* p, int64_t seq) {
  HeadStats s;
  double ent = 0, dist = 0, first = 0;
  for (int64_t i = 0; i < seq; ++i) {
    const float* row = p + i * seq;
    for (int64_t j = 0; j < seq; ++j) {
      const double w = row[j];
      if (w > 0) ent -= w * std::log(w);
      dist += w * static_cast<double>(std::abs(i - j));
    }
    if (i >= 1) first += row[0];
  }
  s.entropy = ent / static_cast<double>(seq);
  s.mean_distance = dist / static_cast<double>(seq);
  s.first_token = seq > 1 ? first / static_cast<double>(seq - 1) : 0.0;
  return s;
}

namespace {

// A special token spelled as such: "[CLS]", "[SEP]", "<|im_start|>", "<s>", "</s>".
bool special_token(const std::string& s) {
  return (s.size() > 2 && s.front() == '[' && s.back() == ']') ||
         (s.size() > 4 && s.starts_with("<|") && s.ends_with("|>")) || s == "<s>" || s == "</s>";
}

}  // namespace

std::vector<Word> split_words(const std::vector<std::string>& token_text) {
  std::vector<Word> words;
  for (size_t t = 0; t < token_text.size(); ++t) {
    const std::string& s = token_text[t];
    // Whitespace-only tokens (a newline, a run of spaces) stay with the word before them; a special
    // token is a word of its own.
    const bool blank = s.find_first_not_of(" \n\t\r") == std::string::npos;
    const bool starts =
        words.empty() || special_token(s) || special_token(token_text[t - 1]) ||
        (!blank && ((s[0] == ' ' || s[0] == '\n') ||
                    (!token_text[t - 1].empty() && token_text[t - 1].back() == '\n')));
    if (starts) words.push_back({"", static_cast<int64_t>(t), static_cast<int64_t>(t)});
    words.back().last = static_cast<int64_t>(t);
    words.back().text += s;
  }
  for (Word& w : words) {
    const size_t a = w.text.find_first_not_of(" \n");
    const size_t b = w.text.find_last_not_of(" \n");
    w.text = a == std::string::npos ? w.text : w.text.substr(a, b - a + 1);
  }
  return words;
}

Capture capture_tokens(ThreadContext& ctx, model::GPT& m, const model::TextTokenizer* tokenizer,
                       std::span<const int32_t> tokens) {
  const auto& c = m.config();
  const int64_t T = static_cast<int64_t>(tokens.size());
  check(T >= 1 && T <= c.block_size, "text: {} tokens, the model takes 1 to block_size {}", T,
        c.block_size);
  Capture cap;
  cap.tokens.assign(tokens.begin(), tokens.end());
  for (int32_t t : tokens)
    cap.token_text.push_back(tokenizer ? tokenizer->token_bytes(t) : fmt::format("<{}>", t));
  cap.words = split_words(cap.token_text);
  cap.n_layer = c.n_layer;
  cap.n_head = c.n_head;
  cap.seq = T;
  for (int64_t l = 0; l < c.n_layer; ++l) cap.layer_heads.push_back(c.heads(l));
  cap.probs.assign(static_cast<size_t>(c.n_layer * c.n_head * T * T), 0.0f);
  model::ForwardOptions o;
  o.attention_probs = cap.probs.data();
  m.forward(ctx, cap.tokens.data(), 1, T, o);
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int64_t h = 0; h < c.n_head; ++h)
      cap.stats.push_back(h < c.heads(l) ? head_stats(cap.head(l, h), T) : HeadStats{});
  return cap;
}

Capture capture_from_probs(std::vector<int32_t> tokens, std::vector<std::string> token_text,
                           int64_t n_layer, int64_t n_head, std::vector<float> probs) {
  const auto T = static_cast<int64_t>(token_text.size());
  check(T >= 1, "token_text: empty (one text per token is needed)");
  check(static_cast<int64_t>(tokens.size()) == T, "tokens: {} ids for {} token texts",
        tokens.size(), T);
  check(n_layer >= 1 && n_head >= 1, "probs: {} layers × {} heads (at least one of each)", n_layer,
        n_head);
  check(static_cast<int64_t>(probs.size()) == n_layer * n_head * T * T,
        "probs: {} values, expected n_layer {} × n_head {} × {} × {} tokens", probs.size(), n_layer,
        n_head, T, T);
  Capture cap;
  cap.tokens = std::move(tokens);
  cap.token_text = std::move(token_text);
  cap.words = split_words(cap.token_text);
  cap.n_layer = n_layer;
  cap.n_head = n_head;
  cap.seq = T;
  cap.layer_heads.assign(static_cast<size_t>(n_layer), n_head);
  cap.probs = std::move(probs);
  for (int64_t lh = 0; lh < n_layer * n_head; ++lh)
    cap.stats.push_back(head_stats(cap.probs.data() + lh * T * T, T));
  return cap;
}

Capture capture_text(ThreadContext& ctx, model::GPT& m, const model::TextTokenizer& tokenizer,
                     std::string_view text) {
  const auto ids = tokenizer.encode(text);
  check(!ids.empty(), "text: empty");
  return capture_tokens(ctx, m, &tokenizer, ids);
}

std::vector<float> word_attention(const Capture& c) {
  const int64_t W = static_cast<int64_t>(c.words.size()), T = c.seq;
  std::vector<float> out(static_cast<size_t>(c.n_layer * c.n_head * W * W), 0.0f);
  for (int64_t lh = 0; lh < c.n_layer * c.n_head; ++lh) {
    const float* p = c.probs.data() + lh * T * T;
    float* o = out.data() + lh * W * W;
    for (int64_t a = 0; a < W; ++a) {
      const Word& q = c.words[static_cast<size_t>(a)];
      const double rows = static_cast<double>(q.last - q.first + 1);
      for (int64_t b = 0; b < W; ++b) {
        const Word& k = c.words[static_cast<size_t>(b)];
        double sum = 0;
        for (int64_t i = q.first; i <= q.last; ++i)
          for (int64_t j = k.first; j <= k.last; ++j) sum += p[i * T + j];
        o[a * W + b] = static_cast<float>(sum / rows);
      }
    }
  }
  return out;
}

std::string to_json(const Capture& c, bool include_probs) {
  nlohmann::json j;
  j["tokens"] = c.tokens;
  j["token_text"] = c.token_text;  // invalid UTF-8 (a byte token) is replaced when dumped
  auto words = nlohmann::json::array();
  for (const Word& w : c.words)
    words.push_back({{"text", w.text}, {"first", w.first}, {"last", w.last}});
  j["words"] = words;
  j["seq"] = c.seq;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["layer_heads"] = c.layer_heads;
  auto stats = nlohmann::json::array();
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int64_t h = 0; h < c.n_head; ++h) {
      const HeadStats& s = c.stats[static_cast<size_t>(l * c.n_head + h)];
      stats.push_back({{"layer", l},
                       {"head", h},
                       {"entropy", s.entropy},
                       {"mean_distance", s.mean_distance},
                       {"first_token", s.first_token}});
    }
  j["stats"] = stats;
  if (include_probs) {
    auto probs = nlohmann::json::array();
    for (int64_t l = 0; l < c.n_layer; ++l) {
      auto layer = nlohmann::json::array();
      for (int64_t h = 0; h < c.n_head; ++h) {
        auto head = nlohmann::json::array();
        for (int64_t i = 0; i < c.seq; ++i) {
          const float* row = c.head(l, h) + i * c.seq;
          auto r = nlohmann::json::array();
          // Up to the last non-zero weight (at least the diagonal): causal rows stop at i.
          int64_t last = c.seq - 1;
          while (last > i && row[last] == 0.0f) --last;
          for (int64_t k = 0; k <= last; ++k) r.push_back(std::round(row[k] * 1e5f) / 1e5f);
          head.push_back(r);
        }
        layer.push_back(head);
      }
      probs.push_back(layer);
    }
    j["probs"] = probs;
    // The word view, [n_layer][n_head][W][W].
    const int64_t W = static_cast<int64_t>(c.words.size());
    const std::vector<float> wp = word_attention(c);
    auto words_view = nlohmann::json::array();
    for (int64_t l = 0; l < c.n_layer; ++l) {
      auto layer = nlohmann::json::array();
      for (int64_t h = 0; h < c.n_head; ++h) {
        auto head = nlohmann::json::array();
        for (int64_t a = 0; a < W; ++a) {
          auto r = nlohmann::json::array();
          for (int64_t b = 0; b < W; ++b)
            r.push_back(
                std::round(wp[static_cast<size_t>(((l * c.n_head + h) * W + a) * W + b)] * 1e5f) /
                1e5f);
          head.push_back(r);
        }
        layer.push_back(head);
      }
      words_view.push_back(layer);
    }
    j["word_probs"] = words_view;
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_npy(AtomicFile& out, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t s : shape) {
    dims += fmt::format("{}, ", s);
    n *= s;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64 and
  // ended by a newline.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header);
  out.write(data, static_cast<size_t>(n) * 4);
  out.commit();
}

}  // namespace headlight::inspect

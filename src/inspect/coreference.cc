// Coreference on natural passages (see headlight/inspect/coreference.h).

#include "headlight/inspect/coreference.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "headlight/core/read_file.h"
#include "headlight/inspect/capture.h"

namespace headlight::inspect {

namespace {

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Byte offset of each character offset of a UTF-8 string (one past the end included).
std::vector<int64_t> char_to_byte(const std::string& s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(static_cast<int64_t>(i));
  out.push_back(static_cast<int64_t>(s.size()));
  return out;
}

// The [first, last] tokens of bytes [at, at + len).
std::pair<int64_t, int64_t> span_of(const std::vector<int64_t>& map, int64_t at, int64_t len) {
  int64_t first = -1, last = -1;
  for (int64_t b = at; b < at + len; ++b) {
    const int64_t t = map[static_cast<size_t>(b)];
    if (t < 0) continue;
    if (first < 0) first = t;
    last = t;
  }
  return {first, last};
}

}  // namespace

std::vector<CorefPassage> read_coreference_passages(const std::string& path) {
  const std::string text = read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  check(j.is_object() && j.contains("passages") && j["passages"].is_array(),
        "{}: expected {{\"passages\": [...]}}", path);
  std::vector<CorefPassage> out;
  for (size_t i = 0; i < j["passages"].size(); ++i) {
    const auto& p = j["passages"][i];
    try {
      CorefPassage c;
      c.text = p.at("text").get<std::string>();
      c.pronoun = p.at("pronoun").get<std::string>();
      const auto bytes = char_to_byte(c.text);
      const int64_t chars = static_cast<int64_t>(bytes.size()) - 1;
      auto offset = [&](const nlohmann::json& v, const std::string& what, size_t len) {
        const int64_t at = v.get<int64_t>();
        check(at >= 0 && at < chars, "{}: passage {}: {} offset {} is outside the text", path, i,
              what, at);
        const int64_t b = bytes[static_cast<size_t>(at)];
        check(b + static_cast<int64_t>(len) <= static_cast<int64_t>(c.text.size()),
              "{}: passage {}: {} runs past the text", path, i, what);
        return b;
      };
      c.pronoun_at = offset(p.at("pronoun_at"), "pronoun", c.pronoun.size());
      check(c.text.compare(static_cast<size_t>(c.pronoun_at), c.pronoun.size(), c.pronoun) == 0,
            "{}: passage {}: \"{}\" is not at pronoun_at", path, i, c.pronoun);
      auto name = [&](const nlohmann::json& n, const std::string& what) {
        CorefName out{n.at("name").get<std::string>(), 0};
        out.at = offset(n.at("at"), what, out.name.size());
        check(c.text.compare(static_cast<size_t>(out.at), out.name.size(), out.name) == 0,
              "{}: passage {}: {} \"{}\" is not at its offset", path, i, what, out.name);
        check(out.at + static_cast<int64_t>(out.name.size()) <= c.pronoun_at,
              "{}: passage {}: {} \"{}\" does not come before the pronoun", path, i, what,
              out.name);
        return out;
      };
      c.antecedent = name(p.at("antecedent"), "antecedent");
      for (const auto& d : p.at("distractors")) c.distractors.push_back(name(d, "distractor"));
      check(!c.distractors.empty(), "{}: passage {}: no distractors", path, i);
      out.push_back(std::move(c));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: passage {}: {}", path, i, e.what());
    }
  }
  check(!out.empty(), "{}: no passages", path);
  return out;
}

std::vector<int64_t> token_of_byte(const model::TextTokenizer& tokenizer,
                                   const std::vector<int32_t>& ids, const std::string& text) {
  const int64_t n = static_cast<int64_t>(text.size());
  std::vector<int64_t> map(static_cast<size_t>(n), -1);
  int64_t pos = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    std::string content;
    for (char c : tokenizer.token_bytes(ids[t]))
      if (!space(c)) content.push_back(lower(c));
    if (content.empty()) continue;
    // Match content against the text's next non-space bytes; a token that does not match (a
    // special token such as [CLS] or a BOS) takes no bytes.
    int64_t p = pos;
    std::vector<int64_t> taken;
    bool match = true;
    for (char c : content) {
      while (p < n && space(text[static_cast<size_t>(p)])) ++p;
      if (p >= n || lower(text[static_cast<size_t>(p)]) != c) {
        match = false;
        break;
      }
      taken.push_back(p++);
    }
    if (!match) continue;
    for (int64_t b : taken) map[static_cast<size_t>(b)] = static_cast<int64_t>(t);
    pos = p;
  }
  for (int64_t b = 0; b < n; ++b)
    check(space(text[static_cast<size_t>(b)]) || map[static_cast<size_t>(b)] >= 0,
          "coreference: the tokens do not cover byte {} of \"{}\"", b, text);
  return map;
}

bool PassageWeights::right(int64_t layer, int64_t head, int64_t n_head) const {
  const double a = weight(layer, head, n_head, 0);
  for (int64_t k = 1; k < names; ++k)
    if (!(a > weight(layer, head, n_head, k))) return false;
  return true;
}

std::optional<PassageWeights> passage_weights(ThreadContext& ctx, model::GPT& m,
                                              const model::TextTokenizer& tokenizer,
                                              const CorefPassage& p) {
  const auto& c = m.config();
  const std::vector<int32_t> ids = tokenizer.encode(p.text);
  if (ids.empty() || static_cast<int64_t>(ids.size()) > c.block_size) return std::nullopt;
  std::vector<int64_t> map;
  try {
    map = token_of_byte(tokenizer, ids, p.text);
  } catch (const Error&) {
    return std::nullopt;  // a tokenizer that drops or changes characters here ([UNK], accents)
  }
  const int64_t pron = map[static_cast<size_t>(p.pronoun_at)];
  std::vector<std::pair<int64_t, int64_t>> spans{
      span_of(map, p.antecedent.at, static_cast<int64_t>(p.antecedent.name.size()))};
  for (const CorefName& d : p.distractors)
    spans.push_back(span_of(map, d.at, static_cast<int64_t>(d.name.size())));
  if (pron < 0) return std::nullopt;
  for (const auto& s : spans)
    if (s.first < 0 || s.second >= pron) return std::nullopt;  // a name sharing the pronoun's token
  const Capture cap = capture_tokens(ctx, m, &tokenizer, ids);
  const int64_t T = cap.seq;
  PassageWeights w;
  w.names = static_cast<int64_t>(spans.size());
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int64_t h = 0; h < c.n_head; ++h) {
      const float* row = cap.head(l, h) + pron * T;
      for (const auto& s : spans) {
        double sum = 0;
        for (int64_t t = s.first; t <= s.second; ++t) sum += row[t];
        w.weights.push_back(sum);
      }
    }
  w.nearest_is_antecedent = true;
  for (size_t k = 1; k < spans.size(); ++k)
    w.nearest_is_antecedent = w.nearest_is_antecedent && spans[0].second > spans[k].second;
  return w;
}

CorefResult natural_coreference(ThreadContext& ctx, model::GPT& m,
                                const model::TextTokenizer& tokenizer,
                                const std::vector<CorefPassage>& passages) {
  const auto& c = m.config();
  CorefResult r;
  std::vector<int64_t> right(static_cast<size_t>(c.n_layer * c.n_head), 0);
  int64_t nearest = 0;
  for (const CorefPassage& p : passages) {
    const auto w = passage_weights(ctx, m, tokenizer, p);
    if (!w) continue;
    for (int64_t l = 0; l < c.n_layer; ++l)
      for (int64_t h = 0; h < c.n_head; ++h)
        right[static_cast<size_t>(l * c.n_head + h)] += w->right(l, h, c.n_head) ? 1 : 0;
    nearest += w->nearest_is_antecedent ? 1 : 0;
    ++r.passages;
  }
  r.accuracy.assign(right.size(), 0.0);
  if (r.passages > 0) {
    for (size_t i = 0; i < right.size(); ++i)
      r.accuracy[i] = static_cast<double>(right[i]) / static_cast<double>(r.passages);
    r.nearest_name_accuracy = static_cast<double>(nearest) / static_cast<double>(r.passages);
  }
  return r;
}

std::string coreference_json(const CorefResult& r, int64_t n_layer, int64_t n_head) {
  auto layers = nlohmann::json::array();
  for (int64_t l = 0; l < n_layer; ++l) {
    auto row = nlohmann::json::array();
    for (int64_t h = 0; h < n_head; ++h)
      row.push_back(r.accuracy.empty() ? 0.0 : r.accuracy[static_cast<size_t>(l * n_head + h)]);
    layers.push_back(row);
  }
  return nlohmann::json{{"passages", r.passages},
                        {"nearest_name_accuracy", r.nearest_name_accuracy},
                        {"accuracy", layers}}
      .dump();
}

}  // namespace headlight::inspect

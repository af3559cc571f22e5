// Head role scores (definitions in headlight/inspect/roles.h).

#include "headlight/inspect/roles.h"

#include <algorithm>
#include <cmath>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/inspect/capture.h"

namespace headlight::inspect {

void text_scores(const float* p, int64_t seq, RoleScores& s, bool causal) {
  double prev = 0, first = 0, self = 0, dist = 0, uniform = 0;
  for (int64_t i = 0; i < seq; ++i) {
    const float* row = p + i * seq;
    self += row[i];
    for (int64_t j = 0; j < seq; ++j) dist += row[j] * static_cast<double>(std::abs(i - j));
    // The mean distance of uniform attention over the keys row i sees.
    const double before = static_cast<double>(i), after = static_cast<double>(seq - 1 - i);
    uniform += causal
                   ? before / 2.0
                   : (before * (before + 1) + after * (after + 1)) / 2.0 / static_cast<double>(seq);
    if (i >= 1) {
      prev += row[i - 1];
      first += row[0];
    }
  }
  const double rows = static_cast<double>(std::max<int64_t>(1, seq - 1));
  s.previous_token = prev / rows;
  s.first_token = first / rows;
  s.self = self / static_cast<double>(seq);
  s.local = uniform > 0 ? std::clamp(1.0 - dist / uniform, 0.0, 1.0) : 0.0;
}

double induction_score(const float* p, int64_t n) {
  const int64_t T = 2 * n;
  double sum = 0;
  for (int64_t k = 0; k + 1 < n; ++k) sum += p[(n + k) * T + (k + 1)];
  return n > 1 ? sum / static_cast<double>(n - 1) : 0.0;
}

int64_t most_attended_mention(const float* p, int64_t seq, int64_t pronoun_token,
                              const std::vector<std::pair<int64_t, int64_t>>& mentions) {
  const float* row = p + pronoun_token * seq;
  int64_t best = -1;
  double best_w = -1;
  for (size_t m = 0; m < mentions.size(); ++m) {
    double w = 0;
    for (int64_t j = mentions[m].first; j <= mentions[m].second; ++j) w += row[j];
    if (w > best_w) {
      best_w = w;
      best = static_cast<int64_t>(m);
    }
  }
  return best;
}

std::string role_of(const RoleScores& s) {
  const std::pair<const char*, double> specific[] = {{"previous_token", s.previous_token},
                                                     {"first_token", s.first_token},
                                                     {"induction", s.induction},
                                                     {"coreference", s.coreference}};
  const std::pair<const char*, double>* best = nullptr;  // NaN: not measured, skipped
  for (const auto& x : specific)
    if (!std::isnan(x.second) && (!best || x.second > best->second)) best = &x;
  if (best && best->second >= 0.5) return best->first;
  if (s.local >= 0.5) return "local";
  if (s.self >= 0.5) return "self";
  return "mixed";
}

std::vector<int64_t> byte_to_token(const model::TextTokenizer& t,
                                   const std::vector<int32_t>& tokens) {
  std::vector<int64_t> at;
  for (size_t i = 0; i < tokens.size(); ++i)
    at.insert(at.end(), t.token_bytes(tokens[i]).size(), static_cast<int64_t>(i));
  return at;
}

namespace {

// What each part of score_heads reads: the model, its tokenizer, the options, and the layout of
// the scores [n_layer × n_head].
struct Scoring {
  ThreadContext& ctx;
  model::GPT& m;
  const model::TextTokenizer* tokenizer;
  const RoleOptions& o;
  int64_t L, H;
  bool present(int64_t l, int64_t h) const { return h < m.config().heads(l); }
  int64_t uniform_index() const { return L * H; }
};

// Calls f(i, p) with the attention p [seq, seq] of every head present in cap (i = l·H + h), then
// with that of a head that attends uniformly (i = L·H): each row spread evenly over the keys it
// may see. The uniform head is scored by the same code: the baseline beside each score.
template <typename F>
void for_each_head(const Scoring& sc, const Capture& cap, F&& f) {
  for (int64_t l = 0; l < sc.L; ++l)
    for (int64_t h = 0; h < sc.H; ++h)
      if (sc.present(l, h)) f(static_cast<size_t>(l * sc.H + h), cap.head(l, h));
  const int64_t T = cap.seq;
  const bool causal = sc.m.config().causal;
  std::vector<float> u(static_cast<size_t>(T * T), 0.0f);  // [T, T]
  for (int64_t i = 0; i < T; ++i) {
    const int64_t keys = causal ? i + 1 : T;
    for (int64_t j = 0; j < keys; ++j)
      u[static_cast<size_t>(i * T + j)] = 1.0f / static_cast<float>(keys);
  }
  f(static_cast<size_t>(sc.uniform_index()), static_cast<const float*>(u.data()));
}

// Previous token (on text), first token, self and local: averaged over the text, or over the first
// 8 test stories.
void add_text_scores(const Scoring& sc, const std::vector<train::Story>& stories,
                     std::vector<RoleScores>& scores) {
  auto& [ctx, m, tokenizer, o, L, H] = sc;
  const auto& c = m.config();
  std::vector<std::vector<int32_t>> texts;
  if (!o.text.empty()) {
    check(tokenizer != nullptr, "text: the model has no tokenizer");
    auto ids = tokenizer->encode(o.text);
    check(static_cast<int64_t>(ids.size()) <= c.block_size,
          "text: {} tokens, longer than the model's context {}", ids.size(), c.block_size);
    texts.push_back(ids);
  } else if (tokenizer) {
    // The first block_size tokens of each (a byte-level model sees a story's first part).
    for (size_t i = 0; i < stories.size() && texts.size() < 8; ++i) {
      auto ids = tokenizer->encode(stories[i].text);
      if (static_cast<int64_t>(ids.size()) > c.block_size)
        ids.resize(static_cast<size_t>(c.block_size));
      texts.push_back(ids);
    }
  }
  for (const auto& ids : texts) {
    const Capture cap = capture_tokens(ctx, m, tokenizer, ids);
    for_each_head(sc, cap, [&](size_t i, const float* p) {
      RoleScores one;
      text_scores(p, cap.seq, one, c.causal);
      RoleScores& s = scores[i];
      const double w = 1.0 / static_cast<double>(texts.size());
      s.previous_token_text += w * one.previous_token;
      s.first_token += w * one.first_token;
      s.self += w * one.self;
      s.local += w * one.local;
    });
  }
}

// Induction and previous token on random tokens repeated twice.
void add_induction_scores(const Scoring& sc, std::vector<RoleScores>& scores) {
  auto& [ctx, m, tokenizer, o, L, H] = sc;
  const auto& c = m.config();
  const int64_t n = o.induction_length > 0 ? std::min(o.induction_length, c.block_size / 2)
                                           : std::min<int64_t>(c.block_size / 2, 48);
  Generator g(o.seed ^ 0x1D0C7105ull);
  const int64_t vocab = tokenizer ? tokenizer->vocab_size() : c.vocab_size;
  for (int64_t sidx = 0; sidx < o.induction_sequences && n > 1; ++sidx) {
    std::vector<int32_t> seq(static_cast<size_t>(2 * n));
    for (int64_t k = 0; k < n; ++k)
      seq[static_cast<size_t>(k)] = seq[static_cast<size_t>(n + k)] =
          o.induction_tokens.empty()
              ? static_cast<int32_t>(g.next_u32() % static_cast<uint32_t>(vocab))
              : o.induction_tokens[g.next_u32() % o.induction_tokens.size()];
    const Capture cap = capture_tokens(ctx, m, tokenizer, seq);
    const double w = 1.0 / static_cast<double>(o.induction_sequences);
    for_each_head(sc, cap, [&](size_t i, const float* p) {
      RoleScores& s = scores[i];
      s.induction += w * induction_score(p, n);
      RoleScores one;
      text_scores(p, cap.seq, one, c.causal);
      s.previous_token += w * one.previous_token;
    });
  }
}

// Coreference on the test stories (needs the tokenizer to find the words): the pronoun's row
// against the names, and against the introducing sentences.
void add_coreference_scores(const Scoring& sc, const std::vector<train::Story>& stories,
                            std::vector<RoleScores>& scores) {
  auto& [ctx, m, tokenizer, o, L, H] = sc;
  const auto& c = m.config();
  // Words are found by byte offsets, which only a lossless tokenizer keeps.
  if (tokenizer && tokenizer->lossless() && o.coreference_stories > 0) {
    std::vector<int64_t> by_name(scores.size(), 0), by_sentence(by_name.size(), 0);
    double chance = 0;
    int64_t counted = 0;
    for (const auto& st : stories) {
      const auto ids = tokenizer->encode(st.text, /*add_special_tokens=*/false);  // offsets
      if (static_cast<int64_t>(ids.size()) > c.block_size) continue;
      const auto at = byte_to_token(*tokenizer, ids);
      auto tokens_of = [&](int64_t offset, int64_t length) {
        return std::pair{at[static_cast<size_t>(offset)],
                         at[static_cast<size_t>(offset + length - 1)]};
      };
      std::vector<std::pair<int64_t, int64_t>> names, sentences;
      for (const auto& ch : st.characters) {
        names.push_back(tokens_of(ch.offset, ch.length));
        sentences.push_back(tokens_of(ch.sentence_offset, ch.sentence_length));
      }
      const Capture cap = capture_tokens(ctx, m, tokenizer, ids);
      for (const train::Reference& ref : st.references) {
        // Names are scored from the possessive whose continuation needs the antecedent's
        // identity (its signature) when the story has one, sentences from the one before the
        // colour.
        const int64_t pronoun = at[static_cast<size_t>(ref.pronoun_offset)];
        const int64_t identity = ref.signature_pronoun_offset >= 0
                                     ? at[static_cast<size_t>(ref.signature_pronoun_offset)]
                                     : pronoun;
        for_each_head(sc, cap, [&](size_t i, const float* p) {
          by_name[i] += most_attended_mention(p, cap.seq, identity, names) == ref.antecedent;
          by_sentence[i] += most_attended_mention(p, cap.seq, pronoun, sentences) == ref.antecedent;
        });
        chance += 1.0 / static_cast<double>(names.size());
        ++counted;
      }
    }
    if (counted >= o.min_pronouns) {
      chance /= static_cast<double>(counted);
      auto above_chance = [&](double acc) {
        return std::max(0.0, (acc - chance) / (1.0 - chance));
      };
      for (size_t i = 0; i < scores.size(); ++i) {
        const double n = static_cast<double>(counted);
        scores[i].coreference_accuracy = static_cast<double>(by_name[i]) / n;
        scores[i].coreference = above_chance(scores[i].coreference_accuracy);
        scores[i].coreference_sentence_accuracy = static_cast<double>(by_sentence[i]) / n;
        scores[i].coreference_sentence = above_chance(scores[i].coreference_sentence_accuracy);
      }
    }
  }
}

}  // namespace

std::vector<RoleScores> score_heads(ThreadContext& ctx, model::GPT& m,
                                    const model::TextTokenizer* tokenizer, const RoleOptions& o,
                                    RoleScores* uniform) {
  const auto& c = m.config();
  const Scoring sc{ctx, m, tokenizer, o, c.n_layer, c.n_head};
  std::vector<RoleScores> scores(static_cast<size_t>(c.n_layer * c.n_head + 1));
  const auto stories =
      train::detective_stories({.split = train::Split::test,
                                .stories = std::max<int64_t>(o.coreference_stories, 1),
                                .seed = o.seed,
                                .signatures = o.signatures});
  add_text_scores(sc, stories, scores);
  add_induction_scores(sc, scores);
  add_coreference_scores(sc, stories, scores);
  if (uniform) *uniform = scores.back();
  scores.pop_back();
  return scores;
}

}  // namespace headlight::inspect

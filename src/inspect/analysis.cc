// Head tables, pruning with measurements, pruning curves and the head-count sweep.

#include "headlight/inspect/analysis.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "headlight/core/read_file.h"
#include "headlight/load/embed.h"
#include "headlight/train/corpus.h"

namespace headlight::inspect {

Dataset corpus_dataset(const model::GPTConfig& c, const model::TextTokenizer* tokenizer,
                       const std::string& corpus, int64_t sequences, int64_t seq, bool signatures) {
  const model::TextTokenizer bytes(model::Tokenizer::byte_level());
  if (!tokenizer) {
    check(c.vocab_size >= 256,
          "corpus: the model has no tokenizer and its vocabulary ({}) does "
          "not hold bytes",
          c.vocab_size);
    tokenizer = &bytes;
  }
  const int64_t len = seq > 0 ? seq : c.block_size;
  // Enough validation stories for the sequences asked for (a story is about 230 bytes).
  const int64_t stories = std::max<int64_t>(50, sequences * len / 50);
  const train::TextSplits text = train::load_text(corpus, 0, stories, {.signatures = signatures});
  // One stream of tokens cut into sequences: no special tokens around it.
  const auto ids = tokenizer->encode(text.validation, /*add_special_tokens=*/false);
  return make_dataset(ids, c, len, sequences);
}

bool measurable(const model::GPTConfig& c, const Dataset& d) {
  return c.lm_head || d.sentences();
}

namespace {

// The lines of a text that hold more than blanks.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(std::move(line));
    at = end + 1;
  }
  return lines;
}

std::vector<std::string> text_lines(const std::string& path) {
  const std::vector<std::string> lines = split_lines(read_file(path));
  check(lines.size() >= 2,
        "{}: needs at least two non-empty lines (a part to score importance "
        "on and a held-out part), has {}",
        path, lines.size());
  return lines;
}

std::string joined(std::span<const std::string> lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

Dataset part_dataset(ThreadContext& ctx, load::Model& m, std::span<const std::string> lines,
                     const DataOptions& o, int64_t len) {
  const model::GPTConfig& c = m.net.config();
  const model::TextTokenizer* t = m.tokenizer ? &*m.tokenizer : nullptr;
  if (!c.lm_head && m.pooling.mode != load::Pooling::Mode::none && t) {
    std::vector<std::vector<int32_t>> sentences;
    for (const std::string& line : lines) {
      if (static_cast<int64_t>(sentences.size()) >= 4 * o.sequences) break;
      sentences.push_back(load::embedding_tokens(*t, line, m.max_seq_length));
    }
    return make_sentence_dataset(ctx, m.net, sentences, m.pooling);
  }
  const model::TextTokenizer bytes(model::Tokenizer::byte_level());
  if (!t) {
    check(c.vocab_size >= 256,
          "corpus: the model has no tokenizer and its vocabulary ({}) does not hold bytes",
          c.vocab_size);
    t = &bytes;
  }
  const auto ids = t->encode(joined(lines), /*add_special_tokens=*/false);
  return make_dataset(ids, c, len, o.sequences);
}

}  // namespace

Datasets corpus_datasets(ThreadContext& ctx, load::Model& m, const DataOptions& o) {
  const model::GPTConfig& c = m.net.config();
  check(o.seq <= c.block_size, "seq: {} is longer than the model's context {}", o.seq,
        c.block_size);
  const int64_t len = o.seq > 0 ? o.seq : std::min<int64_t>(c.block_size, 256);
  const model::TextTokenizer* t = m.tokenizer ? &*m.tokenizer : nullptr;
  if (o.corpus == "detective") {
    const bool sentences = !c.lm_head && m.pooling.mode != load::Pooling::Mode::none && t;
    if (!sentences) {
      Dataset d = corpus_dataset(c, t, o.corpus, o.sequences, len, o.signatures);
      return {d, d};
    }
    const int64_t stories = std::max<int64_t>(50, o.sequences);
    const train::TextSplits text =
        train::load_text(o.corpus, 0, stories, {.signatures = o.signatures});
    Dataset d = part_dataset(ctx, m, split_lines(text.validation), o, len);
    return {d, d};
  }
  const std::vector<std::string> lines = text_lines(o.corpus);
  const size_t half = lines.size() / 2;
  return {part_dataset(ctx, m, std::span(lines).first(half), o, len),
          part_dataset(ctx, m, std::span(lines).subspan(half), o, len)};
}

namespace {

// The tokens that occur in `ids`, sorted: what the induction sequences are drawn from, so that a
// model is tested on tokens its corpus has (a BPE vocabulary also holds bytes it never saw).
std::vector<int32_t> distinct_tokens(std::span<const int32_t> ids) {
  std::vector<int32_t> seen(ids.begin(), ids.end());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  return seen;
}

}  // namespace

std::vector<HeadRow> head_table(ThreadContext& ctx, model::GPT& m,
                                const model::TextTokenizer* tokenizer, const Dataset& d,
                                const RoleOptions& o, RoleScores* uniform) {
  const auto& c = m.config();
  RoleOptions with_tokens = o;
  if (with_tokens.induction_tokens.empty())
    with_tokens.induction_tokens = distinct_tokens(d.tokens);
  const auto scores = score_heads(ctx, m, tokenizer, with_tokens, uniform);
  // Importance is measured on the LM loss or the sentences' embeddings; a model with neither (an
  // encoder without an LM head or pooling) has none (NaN).
  const size_t n = static_cast<size_t>(c.n_layer * c.n_head);
  const bool measured = measurable(c, d);
  const auto grad = measured ? gradient_importance(ctx, m, d)
                             : std::vector<double>(n, std::numeric_limits<double>::quiet_NaN());
  const auto abl = measured && o.ablation
                       ? ablation_importance(ctx, m, d)
                       : std::vector<double>(n, std::numeric_limits<double>::quiet_NaN());
  std::vector<HeadRow> rows;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    int64_t h = 0, kv = 0;
    for (const int64_t group : c.group_sizes(l)) {
      for (int64_t k = 0; k < group; ++k, ++h) {
        const size_t i = static_cast<size_t>(l * c.n_head + h);
        rows.push_back({.layer = l,
                        .head = h,
                        .kv_head = kv,
                        .scores = scores[i],
                        .role = role_of(scores[i]),
                        .importance = grad[i],
                        .ablation = abl[i]});
      }
      ++kv;
    }
  }
  return rows;
}

std::vector<HeadRow> capture_head_table(const Capture& c, bool causal, int64_t repeated) {
  check(repeated >= 0 && (repeated == 0 || 2 * repeated == c.seq),
        "repeated: {} tokens repeated twice make {} tokens, the capture has {}", repeated,
        2 * repeated, c.seq);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<HeadRow> rows;
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int64_t h = 0; h < c.layer_heads[static_cast<size_t>(l)]; ++h) {
      const float* p = c.head(l, h);
      RoleScores s;
      text_scores(p, c.seq, s, causal);
      s.previous_token_text = s.previous_token;
      s.previous_token = nan;
      s.induction = nan;
      if (repeated > 0) {  // the random-token sequence score_heads uses: both scores hold
        s.previous_token = s.previous_token_text;
        s.induction = induction_score(p, repeated);
      }
      s.coreference = s.coreference_accuracy = nan;
      s.coreference_sentence = s.coreference_sentence_accuracy = nan;
      rows.push_back({.layer = l,
                      .head = h,
                      .kv_head = h,  // the grouping is not in a capture: each head its own
                      .scores = s,
                      .role = role_of(s),
                      .importance = nan,
                      .ablation = nan});
    }
  return rows;
}

std::string scores_json(const RoleScores& s) {
  return nlohmann::json{{"previous_token", s.previous_token},
                        {"previous_token_text", s.previous_token_text},
                        {"first_token", s.first_token},
                        {"self", s.self},
                        {"local", s.local},
                        {"induction", s.induction},
                        {"coreference", s.coreference},
                        {"coreference_accuracy", s.coreference_accuracy},
                        {"coreference_sentence", s.coreference_sentence},
                        {"coreference_sentence_accuracy", s.coreference_sentence_accuracy}}
      .dump();
}

std::string head_table_json(const std::vector<HeadRow>& rows) {
  auto heads = nlohmann::json::array();
  for (const HeadRow& r : rows)
    heads.push_back({{"layer", r.layer},
                     {"head", r.head},
                     {"kv_head", r.kv_head},
                     {"role", r.role},
                     {"importance", r.importance},
                     {"ablation", r.ablation},
                     {"scores", nlohmann::json::parse(scores_json(r.scores))}});
  return heads.dump();
}

const HeadRow* focus_head(const std::vector<HeadRow>& rows) {
  const HeadRow* best = nullptr;
  for (const HeadRow& r : rows)
    if (!best || r.scores.coreference > best->scores.coreference) best = &r;
  return best;
}

std::string curve_json(const std::vector<CurvePoint>& points) {
  auto j = nlohmann::json::array();
  for (const CurvePoint& p : points)
    j.push_back({{"method", p.method}, {"fraction", p.fraction}, {"loss", p.loss}});
  return j.dump();
}

std::string sweep_json(const std::vector<SweepRow>& rows) {
  auto j = nlohmann::json::array();
  for (const SweepRow& r : rows)
    j.push_back({{"heads", r.heads},
                 {"val_loss", r.val_loss},
                 {"tokens_per_second", r.tokens_per_second},
                 {"seconds", r.seconds},
                 {"best_scores", nlohmann::json::parse(scores_json(r.best))}});
  return j.dump();
}

PruneBy parse_prune_by(const std::string& name) {
  if (name == "importance") return PruneBy::importance;
  if (name == "ablation") return PruneBy::ablation;
  if (name == "random") return PruneBy::random;
  fail("by: expected importance, ablation or random, got \"{}\"", name);
}

const char* prune_by_name(PruneBy b) {
  return b == PruneBy::importance ? "importance" : b == PruneBy::ablation ? "ablation" : "random";
}

namespace {

// Median seconds of a forward pass over d, for two models timed alternately (a, b, a, b, …) so
// that a burst of load from a neighbour on a shared machine slows both rather than one.
std::pair<double, double> paired_forward_seconds(ThreadContext& ctx, model::GPT& a, model::GPT& b,
                                                 const Dataset& d, int64_t runs) {
  std::vector<double> ta, tb;
  auto time = [&](model::GPT& m, std::vector<double>& t) {
    const auto start = std::chrono::steady_clock::now();
    dataset_loss(ctx, m, d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  dataset_loss(ctx, a, d);  // warm-up
  dataset_loss(ctx, b, d);
  for (int64_t r = 0; r < runs; ++r) {
    time(a, ta);
    time(b, tb);
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

std::vector<double> scores_for(ThreadContext& ctx, model::GPT& m, const Dataset& d, PruneBy by) {
  if (by == PruneBy::importance) return gradient_importance(ctx, m, d);
  if (by == PruneBy::ablation) return ablation_importance(ctx, m, d);
  return {};
}

// The gates `saved` with `heads` switched off (their gates at 0).
void switch_off(model::GPT& m, std::span<const float> saved, const std::vector<HeadId>& heads) {
  m.gates().restore(saved);
  for (const auto& [l, h] : heads) m.gates().at(l, h) = 0.0f;
}

// Heads to remove, chosen step by step as Michel et al. do: `targets` is the running total to reach
// at each step; before each step the remaining heads are scored again with the removed ones
// switched off (their gates at 0), and the lowest go. The model's gates are restored.
std::vector<HeadId> remove_step_by_step(
    ThreadContext& ctx, model::GPT& m, const Dataset& d, PruneBy by,
    const std::vector<int64_t>& targets,
    const std::function<void(const std::vector<HeadId>&)>& at_step) {
  const auto& c = m.config();
  const std::vector<float> saved = m.gates().snapshot();
  std::vector<HeadId> removed;
  for (int64_t target : targets) {
    switch_off(m, saved, removed);
    std::vector<double> scores = scores_for(ctx, m, d, by);
    for (const auto& [l, h] : removed)
      scores[static_cast<size_t>(l * c.n_head + h)] = std::numeric_limits<double>::infinity();
    const int64_t more = target - static_cast<int64_t>(removed.size());
    if (more > 0)
      for (const HeadId& id : heads_to_remove(c, scores, more, 0)) removed.push_back(id);
    if (at_step) {
      switch_off(m, saved, removed);
      at_step(removed);
    }
  }
  m.gates().restore(saved);
  return removed;
}

}  // namespace

PruneResult prune_model(ThreadContext& ctx, model::GPT& m, const Dataset& score,
                        const Dataset& judge, double fraction, PruneBy by, uint64_t seed,
                        int64_t timing_runs) {
  check(fraction >= 0 && fraction <= 1, "fraction: must be in [0, 1], got {}", fraction);
  const int64_t total = m.config().total_heads();
  const int64_t count = static_cast<int64_t>(std::llround(fraction * static_cast<double>(total)));
  PruneResult r;
  if (by == PruneBy::random) {
    r.heads_removed = heads_to_remove(m.config(), {}, count, seed);
  } else {
    // The curve's steps (a tenth of the heads each, rounded) up to the count, re-scoring before
    // each, so that prune and --curve agree.
    std::vector<int64_t> targets;
    for (int k = 1; k <= 9; ++k) {
      const int64_t t = std::llround(k / 10.0 * static_cast<double>(total));
      if (t < count && (targets.empty() || t > targets.back())) targets.push_back(t);
    }
    targets.push_back(count);
    r.heads_removed = remove_step_by_step(ctx, m, score, by, targets, {});
  }
  std::sort(r.heads_removed.begin(), r.heads_removed.end());
  r.loss_before = dataset_loss(ctx, m, judge);
  r.pruned.emplace(prune_heads(m, r.heads_removed));
  r.loss_after = dataset_loss(ctx, *r.pruned, judge);
  std::tie(r.seconds_before, r.seconds_after) =
      paired_forward_seconds(ctx, m, *r.pruned, judge, timing_runs);
  return r;
}

std::vector<CurvePoint> pruning_curve(ThreadContext& ctx, model::GPT& m, const Dataset& score,
                                      const Dataset& judge, const CurveOptions& o) {
  const auto& c = m.config();
  check(!o.fractions.empty(), "fractions: none");
  for (size_t i = 0; i < o.fractions.size(); ++i)
    check(
        o.fractions[i] > 0 && o.fractions[i] < 1 && (i == 0 || o.fractions[i] > o.fractions[i - 1]),
        "fractions: {} must rise strictly inside (0, 1)", o.fractions[i]);
  check(o.random_seeds >= 1, "random_seeds: must be ≥ 1, got {}", o.random_seeds);
  const std::vector<float> saved = m.gates().snapshot();
  const int64_t total = c.total_heads();
  std::vector<int64_t> targets;
  for (double f : o.fractions) targets.push_back(std::llround(f * static_cast<double>(total)));
  std::vector<CurvePoint> out;
  for (size_t k = 0; k < o.methods.size(); ++k) {
    const PruneBy by = o.methods[k];
    if (by == PruneBy::random) {
      for (size_t i = 0; i < targets.size(); ++i) {
        double sum = 0;
        for (int64_t s = 0; s < o.random_seeds; ++s) {
          switch_off(m, saved, heads_to_remove(c, {}, targets[i], static_cast<uint64_t>(s + 1)));
          sum += dataset_loss(ctx, m, judge);
        }
        out.push_back({"random", o.fractions[i], sum / static_cast<double>(o.random_seeds)});
      }
      continue;
    }
    size_t step = 0;
    remove_step_by_step(ctx, m, score, by, targets, [&](const std::vector<HeadId>&) {
      out.push_back({prune_by_name(by), o.fractions[step++], dataset_loss(ctx, m, judge)});
    });
  }
  m.gates().restore(saved);
  // Ordered by fraction, then by the methods' order.
  std::stable_sort(out.begin(), out.end(), [](const CurvePoint& a, const CurvePoint& b) {
    return a.fraction < b.fraction;
  });
  return out;
}

std::vector<SweepRow> head_sweep(ThreadContext& ctx, const model::GPTConfig& base,
                                 const model::Tokenizer& tokenizer, const SweepOptions& so) {
  const train::TextSplits text = train::load_text(so.corpus, so.stories, 200, so.shape);
  const auto train_ids = tokenizer.encode(text.train), val_ids = tokenizer.encode(text.validation);
  std::vector<SweepRow> rows;
  for (int64_t h : so.heads) {
    model::GPTConfig c = base;
    c.n_head = h;
    c.n_kv_head = h;
    c.vocab_size = std::max(c.vocab_size, tokenizer.vocab_size());
    check(c.n_embd % h == 0, "heads: n_embd {} is not divisible by {} heads", c.n_embd, h);
    model::GPT m(c, so.train.seed);
    m.set_dtype(so.dtype);
    train::TrainOptions o = so.train;
    o.out.clear();
    o.metrics.clear();
    const train::TrainResult r = train::train_model(ctx, m, &tokenizer, train_ids, val_ids, o);
    SweepRow row;
    row.heads = h;
    row.val_loss = r.val_loss;
    row.tokens_per_second = r.tokens_per_second;
    row.seconds = r.seconds;
    // Scored as `heads` scores the corpus's models: induction on the tokens of its text, and
    // coreference by name from the signature's possessive when the stories have signatures.
    RoleOptions ro;
    ro.coreference_stories = so.corpus == "detective" ? 100 : 0;
    ro.signatures = so.shape.signatures;
    ro.induction_tokens = distinct_tokens(val_ids);
    const model::TextTokenizer text_tokenizer(tokenizer);
    for (const RoleScores& s : score_heads(ctx, m, &text_tokenizer, ro)) {
      row.best.previous_token = std::max(row.best.previous_token, s.previous_token);
      row.best.previous_token_text = std::max(row.best.previous_token_text, s.previous_token_text);
      row.best.first_token = std::max(row.best.first_token, s.first_token);
      row.best.self = std::max(row.best.self, s.self);
      row.best.local = std::max(row.best.local, s.local);
      row.best.induction = std::max(row.best.induction, s.induction);
      row.best.coreference = std::max(row.best.coreference, s.coreference);
      row.best.coreference_accuracy =
          std::max(row.best.coreference_accuracy, s.coreference_accuracy);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace headlight::inspect

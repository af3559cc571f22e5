// Head importance (gradient and ablation) and physical pruning.

#include "headlight/inspect/importance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/load/embed.h"
#include "headlight/train/objective.h"

namespace headlight::inspect {

Dataset make_dataset(std::span<const int32_t> data, const model::GPTConfig& c, int64_t seq,
                     int64_t max_sequences) {
  check(seq >= 1 && seq <= c.block_size, "seq: {} outside [1, block_size {}]", seq, c.block_size);
  const train::Objective objective = train::Objective::of(c);
  const int64_t windows = objective.windows(static_cast<int64_t>(data.size()), seq);
  check(windows >= 1, "data: {} tokens, fewer than one window of {}", data.size(),
        objective.span(seq));
  Dataset d;
  d.seq = seq;
  d.count = std::min(windows, max_sequences);
  d.tokens.resize(static_cast<size_t>(d.count * seq));
  d.targets.resize(d.tokens.size());
  Generator g(0x5EED);
  for (int64_t w = 0; w < d.count; ++w)
    objective.fill(data.data() + w * seq, seq, g, d.tokens.data() + w * seq,
                   d.targets.data() + w * seq);
  return d;
}

namespace {

// The sentences [first, end) of d: their tokens packed end to end and the forward options that
// keep each to itself.
struct SentenceBatch {
  const int32_t* tokens = nullptr;
  int64_t rows = 0;
  model::ForwardOptions options;
};
SentenceBatch sentence_batch(const Dataset& d, const std::vector<int64_t>& starts, int64_t first,
                             int64_t end) {
  SentenceBatch b;
  b.tokens = d.tokens.data() + starts[static_cast<size_t>(first)];
  b.options.lengths.assign(d.lengths.begin() + first, d.lengths.begin() + end);
  for (int64_t len : b.options.lengths) b.rows += len;
  return b;
}

std::vector<int64_t> sentence_starts(const Dataset& d) {
  std::vector<int64_t> starts{0};
  for (int64_t len : d.lengths) starts.push_back(starts.back() + len);
  return starts;
}

// The pooled embeddings [end − first, C] of sentences [first, end) (before any normalisation).
void pooled(ThreadContext& ctx, model::GPT& m, const Dataset& d, const std::vector<int64_t>& starts,
            int64_t first, int64_t end, float* out) {
  SentenceBatch b = sentence_batch(d, starts, first, end);
  b.options.inference = true;
  const int64_t C = m.config().n_embd;
  const float* h = m.forward(ctx, b.tokens, 1, b.rows, b.options);
  load::Pooling raw = d.pooling;
  raw.normalize = false;
  int64_t row = 0;
  for (int64_t s = first; s < end; ++s) {
    const int64_t len = d.lengths[static_cast<size_t>(s)];
    load::pool(raw, h + row * C, len, C, out + (s - first) * C);
    row += len;
  }
}

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t j = 0; j < n; ++j) {
    ab += static_cast<double>(a[j]) * b[j];
    aa += static_cast<double>(a[j]) * a[j];
    bb += static_cast<double>(b[j]) * b[j];
  }
  return ab / std::max(std::sqrt(aa * bb), 1e-30);
}

constexpr int64_t kSentencesPerBatch = 32;

// L2 normalisation of each layer's scores (heads a pruned layer lacks: 0).
void normalise_per_layer(const model::GPTConfig& c, std::vector<double>& score) {
  const int64_t L = c.n_layer, H = c.n_head;
  for (int64_t l = 0; l < L; ++l) {
    double norm = 0;
    for (int64_t h = 0; h < H; ++h) norm += score[l * H + h] * score[l * H + h];
    norm = std::sqrt(norm);
    for (int64_t h = 0; h < H; ++h)
      score[l * H + h] = h < c.heads(l) && norm > 0 ? score[l * H + h] / norm : 0.0;
  }
}

// The sentences' estimate of gradient_importance (see importance.h).
std::vector<double> sentence_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d) {
  const auto& c = m.config();
  const int64_t C = c.n_embd, n = c.n_layer * c.n_head;
  const auto starts = sentence_starts(d);
  std::vector<double> score(static_cast<size_t>(n), 0.0);
  std::vector<float> dh, e(static_cast<size_t>(C));
  std::vector<double> r(static_cast<size_t>(C));
  load::Pooling raw = d.pooling;  // the embedding before any normalisation
  raw.normalize = false;
  const bool cls = d.pooling.mode == load::Pooling::Mode::cls;
  Generator g(0xC051);
  for (int64_t s = 0; s < d.count; ++s) {
    SentenceBatch b = sentence_batch(d, starts, s, s + 1);
    b.options.weight_grads = false;  // the gates' gradients alone
    const float* h = m.forward(ctx, b.tokens, 1, b.rows, b.options);
    // e: the pooled embedding; the probe's gradient at e is P⊥ r / ‖e‖, spread back over the rows
    // pooling read.
    load::pool(raw, h, b.rows, C, e.data());
    double norm = 0, re = 0;
    for (int64_t j = 0; j < C; ++j) norm += static_cast<double>(e[j]) * e[j];
    norm = std::max(std::sqrt(norm), 1e-30);
    for (int64_t j = 0; j < C; ++j) {
      r[static_cast<size_t>(j)] = g.normal();
      re += r[j] * e[j] / norm;
    }
    const int64_t rows = cls ? 1 : b.rows;
    dh.assign(static_cast<size_t>(b.rows * C), 0.0f);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < C; ++j)
        dh[static_cast<size_t>(t * C + j)] =
            static_cast<float>((r[j] - re * e[j] / norm) / norm / static_cast<double>(rows));
    m.gates().zero_grads();
    m.backward(ctx, b.tokens, dh.data(), b.options);
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(m.gates().values()[i]) * m.gates().grads()[i];
      score[static_cast<size_t>(i)] += v * v;
    }
  }
  m.gates().zero_grads();
  normalise_per_layer(c, score);
  return score;
}

}  // namespace

Dataset make_sentence_dataset(ThreadContext& ctx, model::GPT& m,
                              const std::vector<std::vector<int32_t>>& sentences,
                              const load::Pooling& pooling) {
  check(pooling.mode != load::Pooling::Mode::none,
        "pooling: sentences are judged by their embeddings, and the model has no pooling");
  check(!sentences.empty(), "sentences: none");
  Dataset d;
  d.pooling = pooling;
  for (const auto& s : sentences) {
    check(!s.empty() && static_cast<int64_t>(s.size()) <= m.config().block_size,
          "sentences: a sentence of {} tokens (must be 1 … block_size {})", s.size(),
          m.config().block_size);
    d.tokens.insert(d.tokens.end(), s.begin(), s.end());
    d.lengths.push_back(static_cast<int64_t>(s.size()));
  }
  d.count = static_cast<int64_t>(sentences.size());
  const int64_t C = m.config().n_embd;
  d.reference.resize(static_cast<size_t>(d.count * C));
  const auto starts = sentence_starts(d);
  for (int64_t s = 0; s < d.count; s += kSentencesPerBatch)
    pooled(ctx, m, d, starts, s, std::min(d.count, s + kSentencesPerBatch),
           d.reference.data() + s * C);
  return d;
}

double dataset_loss(ThreadContext& ctx, model::GPT& m, const Dataset& d, int64_t batch) {
  if (d.sentences()) {
    const int64_t C = m.config().n_embd;
    const auto starts = sentence_starts(d);
    std::vector<float> e(static_cast<size_t>(kSentencesPerBatch * C));
    double sum = 0;
    for (int64_t s = 0; s < d.count; s += kSentencesPerBatch) {
      const int64_t end = std::min(d.count, s + kSentencesPerBatch);
      pooled(ctx, m, d, starts, s, end, e.data());
      for (int64_t i = s; i < end; ++i)
        sum += cosine(e.data() + (i - s) * C, d.reference.data() + i * C, C);
    }
    return 1.0 - sum / static_cast<double>(d.count);
  }
  double total = 0;
  int64_t n = 0;
  for (int64_t s = 0; s < d.count; s += batch) {
    const int64_t rows = std::min(batch, d.count - s);
    total += static_cast<double>(rows) *
             m.loss(ctx, d.tokens.data() + s * d.seq, d.targets.data() + s * d.seq, rows, d.seq);
    n += rows;
  }
  return total / static_cast<double>(n);
}

std::vector<double> gradient_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d) {
  if (d.sentences()) return sentence_importance(ctx, m, d);
  const auto& c = m.config();
  const int64_t L = c.n_layer, H = c.n_head;
  std::vector<double> score(static_cast<size_t>(L * H), 0.0);
  for (int64_t s = 0; s < d.count; ++s) {
    m.gates().zero_grads();
    model::ForwardOptions gates_only;
    gates_only.weight_grads = false;
    m.forward_backward(ctx, d.tokens.data() + s * d.seq, d.targets.data() + s * d.seq, 1, d.seq,
                       gates_only);
    for (size_t i = 0; i < score.size(); ++i)
      score[i] += std::abs(static_cast<double>(m.gates().values()[i]) * m.gates().grads()[i]);
  }
  m.gates().zero_grads();
  normalise_per_layer(c, score);
  return score;
}

std::vector<double> ablation_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d) {
  const auto& c = m.config();
  const int64_t L = c.n_layer, H = c.n_head;
  const double base = dataset_loss(ctx, m, d);
  std::vector<double> score(static_cast<size_t>(L * H), 0.0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < c.heads(l); ++h) {
      float& gate = m.gates().at(l, h);
      const float saved = gate;
      if (saved == 0.0f) continue;  // already off: removing it changes nothing
      gate = 0.0f;
      score[static_cast<size_t>(l * H + h)] = dataset_loss(ctx, m, d) - base;
      gate = saved;
    }
  return score;
}

model::GPT prune_heads(const model::GPT& m, const std::vector<HeadId>& heads) {
  const model::GPTConfig& c = m.config();
  std::vector<std::vector<bool>> keep(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) keep[l].assign(static_cast<size_t>(c.heads(l)), true);
  for (const auto& [l, h] : heads) {
    check(l >= 0 && l < c.n_layer && h >= 0 && h < c.heads(l),
          "heads: ({}, {}) is not a head of this model ({} layers, {} heads in that layer)", l, h,
          c.n_layer, l >= 0 && l < c.n_layer ? c.heads(l) : 0);
    keep[l][h] = false;
  }
  // Multi-head attention: a head's key and value go with it. Grouped-query attention: a key/value
  // head stays while any of its query heads does, so groups may become unequal (layer_groups).
  const bool grouped = c.n_kv_head != c.n_head || !c.layer_groups.empty();
  model::GPTConfig nc = c;
  nc.layer_heads.clear();
  nc.layer_kv_heads.clear();
  nc.layer_groups.clear();
  std::vector<std::vector<bool>> keep_kv(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::vector<int64_t> groups;
    int64_t h = 0;
    for (const int64_t n : c.group_sizes(l)) {
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i, ++h) kept += keep[l][h] ? 1 : 0;
      keep_kv[l].push_back(kept > 0);
      if (kept > 0) groups.push_back(kept);
    }
    const int64_t kept = std::count(keep[l].begin(), keep[l].end(), true);
    nc.layer_heads.push_back(kept);
    nc.layer_kv_heads.push_back(static_cast<int64_t>(groups.size()));
    if (grouped) nc.layer_groups.push_back(groups);
  }
  model::validate(nc);
  model::GPT out(nc, 0);
  const int64_t hd = c.head_dim(), C = c.n_embd;
  auto src = [&](const std::string& name) { return m.params() + m.layout().at(name).offset; };
  auto dst = [&](const std::string& name) { return out.params() + out.layout().at(name).offset; };
  // Everything but the attention projections is copied whole.
  for (const auto& e : out.layout().entries())
    if (e.name.find(".attn.") == std::string::npos)
      std::memcpy(dst(e.name), src(e.name), sizeof(float) * static_cast<size_t>(e.numel));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".attn.";
    const int64_t H = c.heads(l), G = c.kv_heads(l);
    // c_attn rows: [q heads | k heads | v heads], hd rows each; the kept ones in order.
    std::vector<int64_t> rows;  // source head blocks (in units of hd rows)
    for (int64_t h = 0; h < H; ++h)
      if (keep[l][h]) rows.push_back(h);
    for (int part = 0; part < 2; ++part)
      for (int64_t g = 0; g < G; ++g)
        if (keep_kv[l][g]) rows.push_back(H + part * G + g);
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t from = rows[k] * hd, to = static_cast<int64_t>(k) * hd;
      std::memcpy(dst(p + "c_attn.weight") + to * C, src(p + "c_attn.weight") + from * C,
                  sizeof(float) * static_cast<size_t>(hd * C));
      if (c.bias)
        std::memcpy(dst(p + "c_attn.bias") + to, src(p + "c_attn.bias") + from,
                    sizeof(float) * static_cast<size_t>(hd));
    }
    // c_proj columns [C, H·hd] → [C, Hn·hd].
    const int64_t Hn = nc.heads(l);
    const float* w = src(p + "c_proj.weight");
    float* wn = dst(p + "c_proj.weight");
    for (int64_t r = 0; r < C; ++r) {
      int64_t k = 0;
      for (int64_t h = 0; h < H; ++h) {
        if (!keep[l][h]) continue;
        std::memcpy(wn + r * Hn * hd + k * hd, w + r * H * hd + h * hd,
                    sizeof(float) * static_cast<size_t>(hd));
        ++k;
      }
    }
    if (c.bias)
      std::memcpy(dst(p + "c_proj.bias"), src(p + "c_proj.bias"),
                  sizeof(float) * static_cast<size_t>(C));
    int64_t k = 0;
    for (int64_t h = 0; h < H; ++h)
      if (keep[l][h]) out.gates().at(l, k++) = m.gates().at(l, h);
    for (; k < c.n_head; ++k) out.gates().at(l, k) = 0.0f;
  }
  out.set_dtype(m.dtype());  // a bf16 model's pruned copy runs its products in bf16 too
  return out;
}

std::vector<HeadId> heads_to_remove(const model::GPTConfig& c, const std::vector<double>& scores,
                                    int64_t count, uint64_t seed) {
  std::vector<HeadId> all;
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int64_t h = 0; h < c.heads(l); ++h) all.emplace_back(l, h);
  check(count >= 0 && count <= static_cast<int64_t>(all.size()),
        "count: cannot remove {} of {} heads", count, all.size());
  if (scores.empty()) {
    Generator g(seed);
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[g.next_u32() % i]);
  } else {
    std::stable_sort(all.begin(), all.end(), [&](const HeadId& a, const HeadId& b) {
      return scores[static_cast<size_t>(a.first * c.n_head + a.second)] <
             scores[static_cast<size_t>(b.first * c.n_head + b.second)];
    });
  }
  all.resize(static_cast<size_t>(count));
  return all;
}

}  // namespace headlight::inspect

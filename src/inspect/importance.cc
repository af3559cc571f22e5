// Head importance (gradient and ablation) and physical pruning.

#include "headlight/inspect/importance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"
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

double dataset_loss(ThreadContext& ctx, model::GPT& m, const Dataset& d, int64_t batch) {
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
  const auto& c = m.config();
  const int64_t L = c.n_layer, H = c.n_head;
  std::vector<double> score(static_cast<size_t>(L * H), 0.0);
  for (int64_t s = 0; s < d.count; ++s) {
    m.zero_grads();
    m.forward_backward(ctx, d.tokens.data() + s * d.seq, d.targets.data() + s * d.seq, 1, d.seq);
    for (size_t i = 0; i < score.size(); ++i)
      score[i] += std::abs(static_cast<double>(m.gates().values()[i]) * m.gates().grads()[i]);
  }
  m.zero_grads();
  for (int64_t l = 0; l < L; ++l) {
    double norm = 0;
    for (int64_t h = 0; h < H; ++h) norm += score[l * H + h] * score[l * H + h];
    norm = std::sqrt(norm);
    for (int64_t h = 0; h < H; ++h)
      score[l * H + h] = h < c.heads(l) && norm > 0 ? score[l * H + h] / norm : 0.0;
  }
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
  check(c.n_kv_head == c.n_head,
        "prune: grouped-query models (n_kv_head {} < n_head {}) cannot lose single query heads",
        c.n_kv_head, c.n_head);
  std::vector<std::vector<bool>> keep(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) keep[l].assign(static_cast<size_t>(c.heads(l)), true);
  for (const auto& [l, h] : heads) {
    check(l >= 0 && l < c.n_layer && h >= 0 && h < c.heads(l),
          "heads: ({}, {}) is not a head of this model ({} layers, {} heads in that layer)", l, h,
          c.n_layer, l >= 0 && l < c.n_layer ? c.heads(l) : 0);
    keep[l][h] = false;
  }
  model::GPTConfig nc = c;
  nc.layer_heads.clear();
  nc.layer_kv_heads.clear();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int64_t kept = std::count(keep[l].begin(), keep[l].end(), true);
    nc.layer_heads.push_back(kept);
    nc.layer_kv_heads.push_back(kept);
  }
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
    const int64_t H = c.heads(l), Hn = nc.heads(l);
    // c_attn rows: [q heads | k heads | v heads], hd rows each.
    for (int part = 0; part < 3; ++part) {
      int64_t k = 0;
      for (int64_t h = 0; h < H; ++h) {
        if (!keep[l][h]) continue;
        const int64_t from = (part * H + h) * hd, to = (part * Hn + k) * hd;
        std::memcpy(dst(p + "c_attn.weight") + to * C, src(p + "c_attn.weight") + from * C,
                    sizeof(float) * static_cast<size_t>(hd * C));
        if (c.bias)
          std::memcpy(dst(p + "c_attn.bias") + to, src(p + "c_attn.bias") + from,
                      sizeof(float) * static_cast<size_t>(hd));
        ++k;
      }
    }
    // c_proj columns [C, H·hd] → [C, Hn·hd].
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
      if (keep[l][h])
        if (keep[l][h]) out.gates().at(l, k++) = m.gates().at(l, h);
    for (; k < c.n_head; ++k) out.gates().at(l, k) = 0.0f;
  }
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

// Shared by the reference forward and backward: the scores of one query row, in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "headlight/attention/params.h"
#include "headlight/core/rng.h"

namespace headlight::attention::reference {

// One query row's scores and probabilities.
//   raw[j]  = scale · q_i · k_j          (before soft-capping)
//   s[j]    = the final score, −inf where masked
//   prob[j] = softmax(s)[j]  (0 everywhere when no key is allowed)
//   keep[j] = the dropout multiplier: 0 or 1/(1 − p)  (1 without dropout)
struct RowScores {
  std::vector<double> raw, s, prob, keep;
  double lse = -std::numeric_limits<double>::infinity();
};

// Fills `row` for query (b, h, i).
inline void score_row(const AttentionParams& p, int64_t b, int64_t h, int64_t i, RowScores& row) {
  const AttentionShape& sh = p.shape;
  const AttentionOptions& o = p.options;
  const int64_t n = sh.len_kv;
  const int64_t g = h / (sh.heads / sh.kv_heads);
  const double scale = effective_scale(p);
  const double ninf = -std::numeric_limits<double>::infinity();
  const int64_t pos = i + (o.alignment == Alignment::bottom_right ? sh.len_kv - sh.len_q : 0);
  row.raw.assign(static_cast<size_t>(n), 0.0);
  row.s.assign(static_cast<size_t>(n), ninf);
  row.prob.assign(static_cast<size_t>(n), 0.0);
  row.keep.assign(static_cast<size_t>(n), 1.0);
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;  // float32 or bf16 values, exactly
    for (int64_t e = 0; e < sh.head_dim; ++e)
      dot += static_cast<double>(p.q.value(b, h, i, e)) * p.k.value(b, g, j, e);
    const double raw = scale * dot;
    row.raw[j] = raw;
    bool allowed = o.mask.allows(b, h, i, j);
    if (o.causal && j > pos) allowed = false;
    if (o.window_left >= 0 && j < pos - o.window_left) allowed = false;
    if (o.window_right >= 0 && j > pos + o.window_right) allowed = false;
    if (o.key_lengths && j >= o.key_lengths[b]) allowed = false;
    if (!allowed) continue;
    double s = o.softcap > 0 ? o.softcap * std::tanh(raw / o.softcap) : raw;
    if (o.alibi_slopes) s -= static_cast<double>(o.alibi_slopes[h]) * std::fabs(double(pos - j));
    s += static_cast<double>(o.mask.bias(b, h, i, j));
    row.s[j] = s;
  }
  // Softmax with the running maximum; NaN scores propagate into this row only.
  double m = ninf;
  bool has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(row.s[j])) has_nan = true;
    if (row.s[j] > m) m = row.s[j];
  }
  if (has_nan) {
    for (int64_t j = 0; j < n; ++j) row.prob[j] = std::numeric_limits<double>::quiet_NaN();
    row.lse = std::numeric_limits<double>::quiet_NaN();
  } else if (m == ninf) {
    row.lse = ninf;  // no allowed key: probabilities stay 0
  } else {
    double l = 0;
    for (int64_t j = 0; j < n; ++j) l += row.s[j] == ninf ? 0.0 : std::exp(row.s[j] - m);
    for (int64_t j = 0; j < n; ++j)
      row.prob[j] = row.s[j] == ninf ? 0.0 : std::exp(row.s[j] - m) / l;
    row.lse = m + std::log(l);
  }
  if (o.dropout_p > 0) {
    const CounterRng rng(o.dropout_seed);
    const double inv_keep = 1.0 / (1.0 - static_cast<double>(o.dropout_p));
    const uint64_t base = static_cast<uint64_t>(((b * sh.heads + h) * sh.len_q + i) * n);
    for (int64_t j = 0; j < n; ++j)
      row.keep[j] = rng.uniform(base + static_cast<uint64_t>(j)) >= o.dropout_p ? inv_keep : 0.0;
  }
}

}  // namespace headlight::attention::reference

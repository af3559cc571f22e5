// Reference attention backward: the specification of the gradients.
//
// With P the softmax, P' = P ⊙ keep the probabilities after dropout, and dO the output gradient:
//   dV_j  += Σ_i P'_ij dO_i
//   dP'_ij = dO_i · v_j,     dP_ij = dP'_ij · keep_ij
//   D_i    = Σ_j P_ij dP_ij  (= dO_i · O_i)
//   dS_ij  = P_ij (dP_ij − D_i)
//   dRaw_ij = dS_ij · (1 − tanh²(raw_ij / cap))   with soft-capping, else dS_ij
//   dQ_i  += scale · Σ_j dRaw_ij k_j,     dK_j += scale · Σ_i dRaw_ij q_i
// ALiBi and the masks are constants and pass no gradient. Key/value heads shared by a group of
// query heads (GQA) sum the gradients of the whole group. Accumulation is in double.

#include <cmath>

#include "headlight/attention/reference.h"
#include "src/attention/reference/row_scores.h"

namespace headlight::attention::reference {

void backward(const AttentionParams& p) {
  validate(p, /*backward=*/true);
  const AttentionShape& sh = p.shape;
  if (sh.batch == 0 || sh.heads == 0) return;
  const int64_t group = sh.heads / sh.kv_heads;
  const int64_t D = sh.head_dim, Dv = sh.value_dim, N = sh.len_kv;
  const double scale = effective_scale(p);
  const double cap = p.options.softcap;
  // Gradients of one (b, kv head) in double: [len_kv, D] and [len_kv, Dv].
  std::vector<double> dk(static_cast<size_t>(N * D)), dv(static_cast<size_t>(N * Dv));
  std::vector<double> dq(static_cast<size_t>(D)), dp(static_cast<size_t>(N));
  std::vector<float> doi(static_cast<size_t>(Dv)), qi(static_cast<size_t>(D));
  RowScores row;
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t g = 0; g < sh.kv_heads; ++g) {
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < sh.len_q; ++i) {
          score_row(p, b, h, i, row);
          // This row's dO and q, and (below) each key's k and v, as floats (bf16 read exactly).
          for (int64_t e = 0; e < Dv; ++e) doi[e] = p.dout.value(b, h, i, e);
          for (int64_t e = 0; e < D; ++e) qi[e] = p.q.value(b, h, i, e);
          double d_row = 0;
          for (int64_t j = 0; j < N; ++j) {
            double dpj = 0;
            for (int64_t e = 0; e < Dv; ++e)
              dpj += static_cast<double>(doi[e]) * p.v.value(b, g, j, e);
            dp[j] = dpj * row.keep[j];
            d_row += row.prob[j] * dp[j];
            const double w = row.prob[j] * row.keep[j];
            for (int64_t e = 0; e < Dv; ++e) dv[j * Dv + e] += w * doi[e];
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j < N; ++j) {
            double ds = row.prob[j] * (dp[j] - d_row);
            if (ds == 0.0) continue;  // masked key (NaN compares unequal and is kept)
            if (cap > 0) {
              const double t = std::tanh(row.raw[j] / cap);
              ds *= 1.0 - t * t;
            }
            for (int64_t e = 0; e < D; ++e) {
              dq[e] += scale * ds * p.k.value(b, g, j, e);
              dk[j * D + e] += scale * ds * qi[e];
            }
          }
          for (int64_t e = 0; e < D; ++e) p.dq.store(b, h, i, e, static_cast<float>(dq[e]));
        }
      }
      for (int64_t j = 0; j < N; ++j) {
        for (int64_t e = 0; e < D; ++e) p.dk.store(b, g, j, e, static_cast<float>(dk[j * D + e]));
        for (int64_t e = 0; e < Dv; ++e) p.dv.store(b, g, j, e, static_cast<float>(dv[j * Dv + e]));
      }
    }
  }
}

}  // namespace headlight::attention::reference

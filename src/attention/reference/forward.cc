// Reference attention forward: the specification (see params.h for the formulas).
//
//   for each (b, h, i):  scores of row i against every key (row_scores.h), softmax in double,
//                        out[b,h,i,:] = Σ_j P'_ij · v[b,g,j,:]
// bf16 inputs are read exactly (widened) and everything is computed in double as for float32: the
// reference is exact attention of the bf16 values, rounded once (to float32, or to bf16 for a bf16
// output).
// Cost O(B·H·L_q·L_kv·(D + D_v)) with no tiling; memory O(L_kv) per row.

#include <cmath>
#include <vector>

#include "headlight/attention/reference.h"
#include "src/attention/reference/row_scores.h"

namespace headlight::attention::reference {

void forward(const AttentionParams& p) {
  validate(p, /*backward=*/false);
  if (p.kv_layout == KvLayout::blocked) {  // the specification reads rows
    std::vector<bf16> k, v;
    forward(with_row_cache(p, k, v));
    return;
  }
  const AttentionShape& sh = p.shape;
  const int64_t group = sh.kv_heads > 0 ? sh.heads / sh.kv_heads : 1;
  RowScores row;
  std::vector<double> acc(static_cast<size_t>(sh.value_dim));
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t h = 0; h < sh.heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < sh.len_q; ++i) {
        score_row(p, b, h, i, row);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < sh.len_kv; ++j) {
          const double w = row.prob[j] * row.keep[j];
          if (w == 0.0) continue;
          for (int64_t e = 0; e < sh.value_dim; ++e) acc[e] += w * p.v.value(b, g, j, e);
        }
        if (std::isnan(row.lse))  // a NaN score poisons the whole row, as the formula says
          std::fill(acc.begin(), acc.end(), std::nan(""));
        for (int64_t e = 0; e < sh.value_dim; ++e)
          p.out.store(b, h, i, e, static_cast<float>(acc[e]));
        const int64_t flat = (b * sh.heads + h) * sh.len_q + i;
        if (p.lse) p.lse[flat] = static_cast<float>(row.lse);
        if (p.entropy || p.argmax || p.max_weight) {
          double h = 0, best = 0;
          int64_t arg = -1;
          for (int64_t j = 0; j < sh.len_kv; ++j) {
            const double pj = row.prob[j];
            if (pj > 0) h -= pj * std::log(pj);
            if (pj > best) {
              best = pj;
              arg = j;
            }
          }
          const bool nan = std::isnan(row.lse);
          if (p.entropy) p.entropy[flat] = nan ? std::nanf("") : static_cast<float>(h);
          if (p.argmax) p.argmax[flat] = nan ? -1 : arg;
          if (p.max_weight) p.max_weight[flat] = nan ? std::nanf("") : static_cast<float>(best);
        }
        if (p.probs) {
          float* pr = p.probs + flat * sh.len_kv;
          for (int64_t j = 0; j < sh.len_kv; ++j)
            pr[j] = static_cast<float>(row.prob[j] * row.keep[j]);
        }
      }
    }
  }
}

}  // namespace headlight::attention::reference

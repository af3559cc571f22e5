#include "headlight/ops/matmul.h"

#include <oneapi/dnnl/dnnl.h>

#include "headlight/core/error.h"

namespace headlight::ops {

void matmul(ThreadContext& ctx, const MatrixArg& a, const MatrixArg& b, const OutputArg& c) {
  check(a.cols == b.rows, "matmul: inner dimensions differ: a is [{}, {}], b is [{}, {}]", a.rows,
        a.cols, b.rows, b.cols);
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // oneDNN rejects K = 0; the product is empty, so c = beta · c.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c.data[i * c.ld + j] = c.beta == 0.0f ? 0.0f : c.beta * c.data[i * c.ld + j];
    return;
  }
  OmpThreadsGuard threads(ctx.num_threads());
  const dnnl_status_t status =
      dnnl_sgemm(a.transposed ? 'T' : 'N', b.transposed ? 'T' : 'N', m, n, k, c.alpha, a.data, a.ld,
                 b.data, b.ld, c.beta, c.data, c.ld);
  check(status == dnnl_success, "matmul: oneDNN sgemm failed (status {}) for [{}, {}] x [{}, {}]",
        static_cast<int>(status), m, k, k, n);
}

void linear_forward(ThreadContext& ctx, const LinearShape& s, const float* x, int64_t ldx,
                    const float* weight, const float* bias, float* y, int64_t ldy) {
  if (s.rows == 0 || s.out_features == 0) return;
  float beta = 0.0f;
  if (bias) {
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t o = 0; o < s.out_features; ++o) y[r * ldy + o] = bias[o];
    beta = 1.0f;
  }
  matmul(ctx, {x, s.rows, s.in_features, ldx, false},
         {weight, s.in_features, s.out_features, s.in_features, true}, {y, ldy, 1.0f, beta});
}

void linear_backward(ThreadContext& ctx, const LinearShape& s, const float* x, int64_t ldx,
                     const float* weight, const float* dy, int64_t ldy, const LinearGrads& g) {
  const float beta = g.accumulate ? 1.0f : 0.0f;
  if (g.dx) {
    matmul(ctx, {dy, s.rows, s.out_features, ldy, false},
           {weight, s.out_features, s.in_features, s.in_features, false}, {g.dx, g.lddx, 1, beta});
  }
  if (g.dweight) {
    matmul(ctx, {dy, s.out_features, s.rows, ldy, true}, {x, s.rows, s.in_features, ldx, false},
           {g.dweight, s.in_features, 1, beta});
  }
  if (g.dbias) {
    for (int64_t o = 0; o < s.out_features; ++o) {
      double sum = 0;
      for (int64_t r = 0; r < s.rows; ++r) sum += dy[r * ldy + o];
      g.dbias[o] = (g.accumulate ? g.dbias[o] : 0.0f) + static_cast<float>(sum);
    }
  }
}

}  // namespace headlight::ops

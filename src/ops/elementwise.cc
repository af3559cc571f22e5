#include "headlight/ops/elementwise.h"

#include <cmath>
#include <limits>

namespace headlight::ops {

void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, row[c]);
    if (m == -std::numeric_limits<float>::infinity()) {
      for (int64_t c = 0; c < cols; ++c) row[c] = 0.0f;
      continue;
    }
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      row[c] = std::exp(row[c] - m);
      sum += row[c];
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < cols; ++c) row[c] *= inv;
  }
}

void axpy(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace headlight::ops

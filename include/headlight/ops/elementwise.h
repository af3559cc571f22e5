// Row-wise softmax and small elementwise helpers used by the modules and the unfused path.
#pragma once

#include <cstdint>

namespace headlight::ops {

// In place, each of `rows` rows of `cols` floats (leading dim ld): x ← softmax(x), computed with
// the running maximum so that -inf entries are exact zeros. A row that is entirely -inf becomes
// zeros.
void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t ld);

// y[i] += alpha * x[i] for i < n.
void axpy(int64_t n, float alpha, const float* x, float* y);

}  // namespace headlight::ops

// Row-wise softmax, used by the unfused attention path.
#pragma once

#include <cstdint>

namespace headlight::ops {

// In place, each of `rows` rows of `cols` floats (leading dim ld): x ← softmax(x), computed with
// the running maximum so that -inf entries are exact zeros. A row that is entirely -inf becomes
// zeros.
void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t ld);

}  // namespace headlight::ops

// Row softmax (SIMD through Highway, dynamic dispatch).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/ops/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "src/ops/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {

bool SoftmaxRowDispatch(float* x, int64_t n) {
  return SoftmaxRow(x, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <cmath>
#include <limits>

#include "headlight/ops/elementwise.h"

namespace headlight {

HWY_EXPORT(SoftmaxRowDispatch);

namespace ops {

void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    if (HWY_DYNAMIC_DISPATCH(SoftmaxRowDispatch)(row, cols)) continue;
    // NaN or no allowed entry: NaN spreads over the row; an all −inf row becomes zeros.
    bool has_nan = false;
    for (int64_t c = 0; c < cols; ++c) has_nan = has_nan || std::isnan(row[c]);
    const float fill = has_nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    for (int64_t c = 0; c < cols; ++c) row[c] = fill;
  }
}

}  // namespace ops
}  // namespace headlight

#endif  // HWY_ONCE

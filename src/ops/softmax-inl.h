// Per-target SIMD row softmax (elementwise.cc dispatches to it): a max pass, an exp-and-sum pass,
// and a scaling pass over each row, with a scalar tail.

#if defined(HEADLIGHT_OPS_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADLIGHT_OPS_SOFTMAX_INL_H_
#undef HEADLIGHT_OPS_SOFTMAX_INL_H_
#else
#define HEADLIGHT_OPS_SOFTMAX_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One row of n floats in place. Returns false (leaving the row untouched) when the row holds a
// NaN or is entirely −inf, which the caller handles in scalar code.
inline bool SoftmaxRow(float* HWY_RESTRICT x, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const float ninf = -std::numeric_limits<float>::infinity();
  auto vmax = hn::Set(d, ninf);
  auto nan = hn::Zero(d);
  int64_t c = 0;
  for (; c + L <= n; c += L) {
    const auto v = hn::LoadU(d, x + c);
    vmax = hn::Max(vmax, v);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
  }
  float m = hn::GetLane(hn::MaxOfLanes(d, vmax));
  bool has_nan = !hn::AllFalse(d, hn::MaskFromVec(nan));
  for (int64_t t = c; t < n; ++t) {
    has_nan = has_nan || std::isnan(x[t]);
    m = std::fmax(m, x[t]);
  }
  if (has_nan || m == ninf) return false;
  const auto vm = hn::Set(d, m);
  auto vsum = hn::Zero(d);
  for (c = 0; c + L <= n; c += L) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + c), vm));
    vsum = hn::Add(vsum, e);
    hn::StoreU(e, d, x + c);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (int64_t t = c; t < n; ++t) sum += x[t] = std::exp(x[t] - m);
  const float inv = 1.0f / sum;
  const auto vinv = hn::Set(d, inv);
  for (c = 0; c + L <= n; c += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + c), vinv), d, x + c);
  for (int64_t t = c; t < n; ++t) x[t] *= inv;
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle

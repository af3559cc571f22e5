// bf16 ⇄ float32 over arrays, dispatched to the best SIMD target (the scalar forms in bf16.h are
// the definition; these compute the same bits).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/core/bf16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "headlight/core/bf16.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Widening: the bits shifted into the upper half of a float.
void WidenBf16(const bf16* src, float* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(du)> d16;
  const size_t L = hn::Lanes(df);
  const auto* in = reinterpret_cast<const uint16_t*>(src);
  size_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, in + i)))), df,
               dst + i);
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

// Narrowing, round to nearest even; NaN stays NaN (quiet, same sign).
void NarrowToBf16(const float* src, bf16* dst, size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint16_t, decltype(di)> d16;
  const size_t L = hn::Lanes(df);
  auto* out = reinterpret_cast<uint16_t*>(dst);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto x = hn::LoadU(df, src + i);
    const auto bits = hn::BitCast(di, x);
    const auto bump =
        hn::Add(hn::Set(di, 0x7FFF), hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 1)));
    auto upper = hn::And(hn::ShiftRight<16>(hn::Add(bits, bump)), hn::Set(di, 0xFFFF));
    const auto quiet_nan =
        hn::Or(hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 0xFFFF)), hn::Set(di, 0x0040));
    upper = hn::IfThenElse(hn::RebindMask(di, hn::IsNaN(x)), quiet_nan, upper);
    hn::StoreU(hn::DemoteTo(d16, upper), d16, out + i);
  }
  for (; i < n; ++i) dst[i] = to_bf16(src[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headlight {

HWY_EXPORT(WidenBf16);
HWY_EXPORT(NarrowToBf16);

void to_bf16(const float* src, bf16* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(NarrowToBf16)(src, dst, n);
}

void to_float(const bf16* src, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(WidenBf16)(src, dst, n);
}

}  // namespace headlight
#endif

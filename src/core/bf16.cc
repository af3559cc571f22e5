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

#include <algorithm>

#include "headlight/core/cpu_info.h"
#include "headlight/core/thread_context.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace headlight {

HWY_EXPORT(WidenBf16);
HWY_EXPORT(NarrowToBf16);

namespace {

#if defined(__x86_64__)
// Narrowing with AVX-512 BF16's vcvtne2ps2bf16 (32 floats per instruction, round to nearest even,
// NaN made quiet: the scalar definition's bits), except that the instruction flushes denormal
// inputs to zero: a block of 32 that holds one (exponent bits 0, mantissa not) goes through the
// portable loop instead, so the bits are the scalar definition's everywhere. Returns how many
// elements it did (a multiple of 32).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) size_t narrow_native(const float* src,
                                                                            bf16* dst, size_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7F800000), mantissa = _mm512_set1_epi32(0x7FFFFF);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i a = _mm512_loadu_si512(src + i), b = _mm512_loadu_si512(src + i + 16);
    const __mmask16 da = _mm512_mask_cmpeq_epi32_mask(
        _mm512_test_epi32_mask(a, mantissa), _mm512_and_si512(a, exponent), _mm512_setzero_si512());
    const __mmask16 db = _mm512_mask_cmpeq_epi32_mask(
        _mm512_test_epi32_mask(b, mantissa), _mm512_and_si512(b, exponent), _mm512_setzero_si512());
    if ((da | db) != 0) {
      HWY_DYNAMIC_DISPATCH(NarrowToBf16)(src + i, dst + i, 32);
      continue;
    }
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_castsi512_ps(b), _mm512_castsi512_ps(a));
    _mm512_storeu_si512(dst + i, (__m512i)h);
  }
  return i;
}
#else
size_t narrow_native(const float*, bf16*, size_t) {
  return 0;
}
#endif

}  // namespace

void to_bf16(const float* src, bf16* dst, size_t n) {
  static const bool native = cpu_has_bf16_dot();
  const size_t done = native && native_bf16_allowed() ? narrow_native(src, dst, n) : 0;
  if (done < n) HWY_DYNAMIC_DISPATCH(NarrowToBf16)(src + done, dst + done, n - done);
}

void to_float(const bf16* src, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(WidenBf16)(src, dst, n);
}

void to_bf16(ThreadContext& ctx, const float* src, bf16* dst, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  ctx.parallel_for((n + kChunk - 1) / kChunk, [&](Range chunks, int) {
    for (int64_t i = chunks.begin; i < chunks.end; ++i)
      to_bf16(src + i * kChunk, dst + i * kChunk,
              static_cast<size_t>(std::min(kChunk, n - i * kChunk)));
  });
}

}  // namespace headlight
#endif

// The portable bf16 tiles (flash_bf16.h has the layout): the same register tiles as the native
// path in flash_bf16_avx512.cc, on every Highway target. Each 32-bit pair word is widened to two
// floats exactly (the even element is the word shifted left by 16, the odd one the word with its
// low half cleared) and multiplied in two FMAs: the fp32 kernel's rate, half its bytes.

#if defined(HEADLIGHT_ATTENTION_FLASH_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADLIGHT_ATTENTION_FLASH_BF16_INL_H_
#undef HEADLIGHT_ATTENTION_FLASH_BF16_INL_H_
#else
#define HEADLIGHT_ATTENTION_FLASH_BF16_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "src/attention/cpu/flash_bf16.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace bf16_tiles {

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;

// The even and odd bf16 elements of pair words, as floats.
HWY_INLINE VF EvenOf(DF d, hn::Vec<DU> w) {
  return hn::BitCast(d, hn::ShiftLeft<16>(w));
}
HWY_INLINE VF OddOf(DF d, hn::Vec<DU> w) {
  return hn::BitCast(d, hn::And(w, hn::Set(DU(), 0xFFFF0000u)));
}
HWY_INLINE float EvenOf(uint32_t w) {
  const uint32_t bits = w << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
HWY_INLINE float OddOf(uint32_t w) {
  const uint32_t bits = w & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// acc[r][x] (= α_r · c[r, x] when load_c, else 0) + Σ_k a(r, k) · b[k, x], a and b pair words;
// the result scaled by `scale` and stored to c.
template <size_t R, size_t NV>
HWY_INLINE void PairMicro(const uint32_t* HWY_RESTRICT a, size_t lda, size_t pairs,
                          const uint32_t* HWY_RESTRICT b, size_t ldb, float* HWY_RESTRICT c,
                          size_t ldc, bool load_c, const float* alpha, float scale) {
  const DF d;
  const DU du;
  const size_t L = hn::Lanes(d);
#if HWY_HAVE_SCALABLE
  for (size_t r = 0; r < R; ++r)
    for (size_t x = 0; x < NV; ++x) {
      VF acc = load_c
                   ? hn::Mul(hn::Set(d, alpha ? alpha[r] : 1.0f), hn::LoadU(d, c + r * ldc + x * L))
                   : hn::Zero(d);
      for (size_t k = 0; k < pairs; ++k) {
        const auto w = hn::LoadU(du, b + k * ldb + x * L);
        acc = hn::MulAdd(hn::Set(d, EvenOf(a[r * lda + k])), EvenOf(d, w), acc);
        acc = hn::MulAdd(hn::Set(d, OddOf(a[r * lda + k])), OddOf(d, w), acc);
      }
      hn::StoreU(hn::Mul(acc, hn::Set(d, scale)), d, c + r * ldc + x * L);
    }
#else
  VF acc[R][NV];
  for (size_t r = 0; r < R; ++r) {
    const VF al = hn::Set(d, alpha ? alpha[r] : 1.0f);
    for (size_t x = 0; x < NV; ++x)
      acc[r][x] = load_c ? hn::Mul(al, hn::LoadU(d, c + r * ldc + x * L)) : hn::Zero(d);
  }
  for (size_t k = 0; k < pairs; ++k) {
    VF be[NV], bo[NV];
    for (size_t x = 0; x < NV; ++x) {
      const auto w = hn::LoadU(du, b + k * ldb + x * L);
      be[x] = EvenOf(d, w);
      bo[x] = OddOf(d, w);
    }
    for (size_t r = 0; r < R; ++r) {
      const uint32_t w = a[r * lda + k];
      const VF ae = hn::Set(d, EvenOf(w)), ao = hn::Set(d, OddOf(w));
      for (size_t x = 0; x < NV; ++x)
        acc[r][x] = hn::MulAdd(ao, bo[x], hn::MulAdd(ae, be[x], acc[r][x]));
    }
  }
  const VF vs = hn::Set(d, scale);
  for (size_t r = 0; r < R; ++r)
    for (size_t x = 0; x < NV; ++x) hn::StoreU(hn::Mul(acc[r][x], vs), d, c + r * ldc + x * L);
#endif
}

// Rows of R, the width in blocks of 2 vectors (the widened right-hand side takes twice the
// registers of the native path's), then 1.
template <size_t R>
HWY_INLINE void PairRows(const uint32_t* a, size_t lda, size_t pairs, const uint32_t* b, size_t ldb,
                         size_t width, float* c, size_t ldc, bool load_c, const float* alpha,
                         float scale) {
  const size_t L = hn::Lanes(DF());
  size_t x = 0;
  for (; x + 2 * L <= width; x += 2 * L)
    PairMicro<R, 2>(a, lda, pairs, b + x, ldb, c + x, ldc, load_c, alpha, scale);
  for (; x < width; x += L)
    PairMicro<R, 1>(a, lda, pairs, b + x, ldb, c + x, ldc, load_c, alpha, scale);
}

HWY_INLINE void PairTile(const uint32_t* a, size_t lda, size_t rows, size_t pairs,
                         const uint32_t* b, size_t ldb, size_t width, float* c, size_t ldc,
                         bool load_c, const float* alpha, float scale) {
  size_t r = 0;
  auto at = [&](size_t r0) { return alpha ? alpha + r0 : nullptr; };
  for (; r + 4 <= rows; r += 4)
    PairRows<4>(a + r * lda, lda, pairs, b, ldb, width, c + r * ldc, ldc, load_c, at(r), scale);
  for (; r < rows; ++r)
    PairRows<1>(a + r * lda, lda, pairs, b, ldb, width, c + r * ldc, ldc, load_c, at(r), scale);
}

}  // namespace bf16_tiles

void QkTileBf16(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt, size_t ldk,
                size_t pairs, size_t cols, float scale, float* s, size_t lds) {
  bf16_tiles::PairTile(q, ldq, rows, pairs, kt, ldk, cols, s, lds, false, nullptr, scale);
}

void PvTileBf16(const uint32_t* p, size_t ldp, size_t rows, size_t pairs, const uint32_t* v,
                size_t ldv, size_t width, float* o, size_t ldo, const float* alpha) {
  bf16_tiles::PairTile(p, ldp, rows, pairs, v, ldv, width, o, ldo, true, alpha, 1.0f);
}

void RoundTileBf16(const float* s, size_t lds, size_t rows, size_t cols, bf16* dst, size_t ldd) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) dst[r * ldd + c] = to_bf16(s[r * lds + c]);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle

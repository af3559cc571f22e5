// The native bf16 tiles: AVX-512 BF16 (vdpbf16ps, vcvtne2ps2bf16), written with intrinsics because
// Highway 1.0 (Debian 12) emulates its bf16 dot products on every target. Each function carries the
// target attribute itself (no file-wide -m flags), so nothing here can leak AVX-512 code into
// other translation units; callers check bf16_native() first.
//
// QkMicro and PvMicro are the register tiles of flash_kernels-inl.h's QkMicro and AccumulateMicro
// with one vdpbf16ps (32 multiply-adds) in place of a 16-lane FMA: R rows × NV vectors of fp32
// accumulators, the right-hand pair vectors loaded once per pair step and shared by the R rows,
// each row's pair (one 32-bit word) broadcast. 6 × 4 accumulators + 4 loaded vectors + 1 broadcast
// = 29 of the 32 vector registers.

#include "src/attention/cpu/flash_bf16.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define HEADLIGHT_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

namespace headlight::attention::cpu::kernels::native {
namespace {

template <size_t R, size_t NV>
HEADLIGHT_BF16_TARGET inline void QkMicro(const uint32_t* q, size_t ldq, const uint32_t* kt,
                                          size_t ldk, size_t pairs, float scale, float* s,
                                          size_t lds) {
  __m512 acc[R][NV];
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (size_t e = 0; e < pairs; ++e) {
    __m512bh k[NV];
    for (size_t v = 0; v < NV; ++v) k[v] = (__m512bh)_mm512_loadu_si512(kt + e * ldk + v * 16);
    for (size_t r = 0; r < R; ++r) {
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * ldq + e]));
      for (size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qv, k[v]);
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v)
      _mm512_storeu_ps(s + r * lds + v * 16, _mm512_mul_ps(acc[r][v], vs));
}

template <size_t R>
HEADLIGHT_BF16_TARGET inline void QkRows(const uint32_t* q, size_t ldq, const uint32_t* kt,
                                         size_t ldk, size_t pairs, size_t cols, float scale,
                                         float* s, size_t lds) {
  size_t c = 0;
  for (; c + 64 <= cols; c += 64) QkMicro<R, 4>(q, ldq, kt + c, ldk, pairs, scale, s + c, lds);
  for (; c < cols; c += 16) QkMicro<R, 1>(q, ldq, kt + c, ldk, pairs, scale, s + c, lds);
}

template <size_t R, size_t NV>
HEADLIGHT_BF16_TARGET inline void PvMicro(const uint32_t* p, size_t ldp, size_t pairs,
                                          const uint32_t* v, size_t ldv, float* o, size_t ldo,
                                          const float* alpha) {
  __m512 acc[R][NV];
  for (size_t r = 0; r < R; ++r) {
    const __m512 al = _mm512_set1_ps(alpha ? alpha[r] : 1.0f);
    for (size_t x = 0; x < NV; ++x)
      acc[r][x] = _mm512_mul_ps(al, _mm512_loadu_ps(o + r * ldo + x * 16));
  }
  for (size_t c = 0; c < pairs; ++c) {
    __m512bh vv[NV];
    for (size_t x = 0; x < NV; ++x) vv[x] = (__m512bh)_mm512_loadu_si512(v + c * ldv + x * 16);
    for (size_t r = 0; r < R; ++r) {
      const __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[r * ldp + c]));
      for (size_t x = 0; x < NV; ++x) acc[r][x] = _mm512_dpbf16_ps(acc[r][x], pv, vv[x]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t x = 0; x < NV; ++x) _mm512_storeu_ps(o + r * ldo + x * 16, acc[r][x]);
}

template <size_t R>
HEADLIGHT_BF16_TARGET inline void PvRows(const uint32_t* p, size_t ldp, size_t pairs,
                                         const uint32_t* v, size_t ldv, size_t width, float* o,
                                         size_t ldo, const float* alpha) {
  size_t x = 0;
  for (; x + 64 <= width; x += 64) PvMicro<R, 4>(p, ldp, pairs, v + x, ldv, o + x, ldo, alpha);
  for (; x < width; x += 16) PvMicro<R, 1>(p, ldp, pairs, v + x, ldv, o + x, ldo, alpha);
}

// Blocks of 6 rows, then the remainder: Rows<R>::run(r0, R) for each block (a class template, as
// a lambda cannot carry the target attribute).
template <template <size_t> class Rows, class... A>
HEADLIGHT_BF16_TARGET inline void ForRowBlocks(size_t rows, A... args) {
  size_t r = 0;
  for (; r + 6 <= rows; r += 6) Rows<6>::run(r, args...);
  switch (rows - r) {
    case 5:
      Rows<5>::run(r, args...);
      break;
    case 4:
      Rows<4>::run(r, args...);
      break;
    case 3:
      Rows<3>::run(r, args...);
      break;
    case 2:
      Rows<2>::run(r, args...);
      break;
    case 1:
      Rows<1>::run(r, args...);
      break;
    default:
      break;
  }
}

template <size_t R>
struct QkBlock {
  HEADLIGHT_BF16_TARGET static void run(size_t r, const uint32_t* q, size_t ldq, const uint32_t* kt,
                                        size_t ldk, size_t pairs, size_t cols, float scale,
                                        float* s, size_t lds) {
    QkRows<R>(q + r * ldq, ldq, kt, ldk, pairs, cols, scale, s + r * lds, lds);
  }
};

template <size_t R>
struct PvBlock {
  HEADLIGHT_BF16_TARGET static void run(size_t r, const uint32_t* p, size_t ldp, size_t pairs,
                                        const uint32_t* v, size_t ldv, size_t width, float* o,
                                        size_t ldo, const float* alpha) {
    PvRows<R>(p + r * ldp, ldp, pairs, v, ldv, width, o + r * ldo, ldo,
              alpha ? alpha + r : nullptr);
  }
};

}  // namespace

HEADLIGHT_BF16_TARGET void qk_tile_bf16(const uint32_t* q, size_t ldq, size_t rows,
                                        const uint32_t* kt, size_t ldk, size_t pairs, size_t cols,
                                        float scale, float* s, size_t lds) {
  ForRowBlocks<QkBlock>(rows, q, ldq, kt, ldk, pairs, cols, scale, s, lds);
}

HEADLIGHT_BF16_TARGET void pv_tile_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t pairs,
                                        const uint32_t* v, size_t ldv, size_t width, float* o,
                                        size_t ldo, const float* alpha) {
  ForRowBlocks<PvBlock>(rows, p, ldp, pairs, v, ldv, width, o, ldo, alpha);
}

HEADLIGHT_BF16_TARGET void round_tile_bf16(const float* s, size_t lds, size_t rows, size_t cols,
                                           bf16* dst, size_t ldd) {
  for (size_t r = 0; r < rows; ++r) {
    const float* src = s + r * lds;
    auto* out = reinterpret_cast<char*>(dst + r * ldd);
    size_t c = 0;
    for (; c + 32 <= cols; c += 32) {
      const __m512bh x =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + c + 16), _mm512_loadu_ps(src + c));
      _mm512_storeu_si512(out + 2 * c, (__m512i)x);
    }
    for (; c < cols; c += 16) {
      const __m256bh x = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * c), (__m256i)x);
    }
  }
}

}  // namespace headlight::attention::cpu::kernels::native

#else  // not x86-64: no native path

#include "headlight/core/error.h"

namespace headlight::attention::cpu::kernels::native {
void qk_tile_bf16(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float,
                  float*, size_t) {
  fail("qk_tile_bf16: no native bf16 path on this architecture");
}
void pv_tile_bf16(const uint32_t*, size_t, size_t, size_t, const uint32_t*, size_t, size_t, float*,
                  size_t, const float*) {
  fail("pv_tile_bf16: no native bf16 path on this architecture");
}
void round_tile_bf16(const float*, size_t, size_t, size_t, bf16*, size_t) {
  fail("round_tile_bf16: no native bf16 path on this architecture");
}
}  // namespace headlight::attention::cpu::kernels::native

#endif

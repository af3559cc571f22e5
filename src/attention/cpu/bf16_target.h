// The AVX-512 BF16 kernels' shared definitions (flash_bf16_avx512.cc, decode_blocked_avx512.cc,
// and the AMX tiles' exponentials in flash_bf16_amx.cc):
// each function carries the target attribute itself (no file-wide -m flags), so nothing can leak
// AVX-512 code into other translation units; callers check bf16_native() first. x86-64 only.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <utility>

// GCC 12's AVX-512 intrinsics pass an uninitialised _mm512_undefined_*() as the unused merge
// operand, which -W(maybe-)uninitialized reports wherever they are inlined: silenced for the files
// that include this.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define HEADLIGHT_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
// Put before every loop over a register tile's rows or vectors: a loop left rolled indexes the
// accumulator array, which then lives on the stack. GCC 12 kept such loops' accumulators in
// registers inside the reduction loop, but stored them to the stack at every call's start and end
// and read them back: unrolled, the vdpbf16ps forward ran 6% faster (N = 512 causal and N = 2048,
// D = 64, on Zen 4). The Highway tiles of flash_kernels-inl.h were unrolled already.
#define HEADLIGHT_UNROLL _Pragma("GCC unroll 16")

namespace headlight::attention::cpu::kernels::native {

// acc + Σ pairs of x · (the pair word *w broadcast to every lane): one vdpbf16ps whose third
// operand is an embedded broadcast from memory ({1to16}), one instruction where
// _mm512_set1_epi32 + _mm512_dpbf16_ps take two (GCC 12 does not fold the broadcast itself).
// The products are the same as _mm512_dpbf16_ps(acc, set1(*w), x)'s.
HEADLIGHT_BF16_TARGET inline __m512 DotBroadcast(__m512 acc, __m512bh x, const uint32_t* w) {
  __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*w));
  return acc;
}

constexpr float kLog2e = 1.44269504088896341f;

// Two rows' 16 floats as pair words (bf16(a), bf16(b)), rounded by vcvtneps2bf16 (nearest even,
// denormals to zero): the row pairs the products read as B operands (row_pairs,
// amx::backward_tile).
HEADLIGHT_BF16_TARGET inline __m512i PairWords(__m512 a, __m512 b) {
  const __m256bh lo = _mm512_cvtneps_pbh(a), hi = _mm512_cvtneps_pbh(b);
  return _mm512_or_si512(_mm512_cvtepu16_epi32((__m256i)lo),
                         _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16));
}

// 2^t (t may be −inf, NaN propagates; t ≤ 0 against a row's true maximum, up to 16 against a lazy
// one within kLazyBound, flash_bf16.h), in seven instructions: t = n + f with n = ⌊t⌋
// and f = t − n ∈ [0, 1) (vreduceps, rounding down), 2^f from a degree-4 polynomial, and 2^n
// applied by vscalefps, which scales by 2^⌊t⌋ itself, so n is never formed. The polynomial is
// exact at both ends (2^0 = 1, 2^1 = 2: a row's maximum weighs exactly 1, also when rounding puts
// t a hair below 0) with relative error < 3.5·10⁻⁶ between (fitted on [0, 1), float arithmetic):
// the weights are rounded to bf16 for P·V (half-ulp 2·10⁻³), and the log-sum-exp, from the fp32
// sums, stays within 10⁻⁵. Below −126 (and for −inf: masked keys) the result is exactly 0: those
// lanes are zeroed by the scalef's mask rather than computed, because a denormal result (and the
// sums of denormals after it) costs a microcode assist of a hundred cycles or more; from −126 up
// the result is a normal number.
HEADLIGHT_BF16_TARGET inline __m512 Exp2(__m512 t) {
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);  // or NaN
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF);
  __m512 p = _mm512_set1_ps(1.35557475e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.20323701e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.41379768e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93032146e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, t);
}

// Rows<R>::run(r0, args...) for each block of kBlock rows from r0, then once for the remaining
// R < kBlock rows (a class template, as a lambda cannot carry the target attribute): register
// tiles of a fixed number of rows over any number.
template <size_t kBlock, template <size_t> class Rows, class... A>
HEADLIGHT_BF16_TARGET inline void ForRowBlocks(size_t rows, A... args) {
  size_t r = 0;
  for (; r + kBlock <= rows; r += kBlock) Rows<kBlock>::run(r, args...);
  [&]<size_t... R>(std::index_sequence<R...>) HEADLIGHT_BF16_TARGET {
    ((rows - r == R + 1 ? Rows<R + 1>::run(r, args...) : void()), ...);
  }
  (std::make_index_sequence<kBlock - 1>{});
}

}  // namespace headlight::attention::cpu::kernels::native
#endif

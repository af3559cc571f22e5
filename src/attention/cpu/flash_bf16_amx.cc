// The AMX bf16 tiles: the two products of a tile on the matrix unit (tdpbf16ps: a 16×16 fp32 tile
// += a 16×32 bf16 tile times a 32×16 one, in pairs; 16,384 multiply-adds per instruction, about
// 15× the fp32 FMA rate per core on Sapphire Rapids). The layouts are flash_bf16.h's pair words,
// which are AMX's: a B tile is 16 rows of pair words (16 pairs of the reduction dim) × 16 columns.
//
// Register blocking: 2 × 2 accumulator tiles (tiles 0–3, 32 rows × 32 columns), two A tiles (4, 5)
// and two B tiles (6, 7) loaded per step of 32 reduction elements: four loads of 1 KB for four
// tdpbf16ps. Rows, reduction and columns are whole tiles (the plan pads them with zeros; the
// caller's junk rows beyond its real rows only produce junk rows of the result, never read).
//   QK   S[r, c]  = scale · Σ_e Q[r, e] K[c, e]    A = Q pair words, B = packed Kᵀ pair words
//   PV   O[r, x] = α_r O[r, x] + Σ_c P[r, c] V[c, x]   A = P (bf16 rows), B = packed V pair words;
//        O is scaled by α with AVX-512 first, then loaded into the accumulator tiles.
// Each worker thread configures its tiles (amx_configure_tiles) before an item's first product.

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "src/attention/cpu/flash_bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass an uninitialised _mm512_undefined_*() as the unused merge
// operand, which -W(maybe-)uninitialized reports wherever they are inlined: silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define HEADLIGHT_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))

namespace headlight::attention::cpu::kernels::amx {
namespace {

// One RT × CT block (RT, CT ∈ {1, 2} tiles of 16) of c = a · b over `steps` steps of 16 words;
// with kLoadC the accumulators start from c, else from zero.
template <int RT, int CT, bool kLoadC>
HEADLIGHT_AMX_TARGET inline void Block(const void* a, size_t lda_bytes, const uint32_t* b,
                                       size_t ldb, size_t steps, size_t a_step_bytes, float* c,
                                       size_t ldc) {
  const auto* a0 = static_cast<const char*>(a);
  const char* a1 = a0 + 16 * lda_bytes;
  const size_t ldc_bytes = ldc * sizeof(float), ldb_bytes = ldb * sizeof(uint32_t);
  if constexpr (kLoadC) {
    _tile_loadd(0, c, ldc_bytes);
    if constexpr (CT == 2) _tile_loadd(1, c + 16, ldc_bytes);
    if constexpr (RT == 2) _tile_loadd(2, c + 16 * ldc, ldc_bytes);
    if constexpr (RT == 2 && CT == 2) _tile_loadd(3, c + 16 * ldc + 16, ldc_bytes);
  } else {
    _tile_zero(0);
    if constexpr (CT == 2) _tile_zero(1);
    if constexpr (RT == 2) _tile_zero(2);
    if constexpr (RT == 2 && CT == 2) _tile_zero(3);
  }
  for (size_t k = 0; k < steps; ++k) {
    _tile_loadd(4, a0 + k * a_step_bytes, lda_bytes);
    if constexpr (RT == 2) _tile_loadd(5, a1 + k * a_step_bytes, lda_bytes);
    const uint32_t* bk = b + k * 16 * ldb;
    _tile_loadd(6, bk, ldb_bytes);
    if constexpr (CT == 2) _tile_loadd(7, bk + 16, ldb_bytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (CT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (RT == 2 && CT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc_bytes);
  if constexpr (CT == 2) _tile_stored(1, c + 16, ldc_bytes);
  if constexpr (RT == 2) _tile_stored(2, c + 16 * ldc, ldc_bytes);
  if constexpr (RT == 2 && CT == 2) _tile_stored(3, c + 16 * ldc + 16, ldc_bytes);
}

// c[rows, cols] (= or +=) a · b in 2 × 2 blocks with 1-tile edges.
template <bool kLoadC>
HEADLIGHT_AMX_TARGET void Product(const void* a, size_t lda_bytes, size_t rows, const uint32_t* b,
                                  size_t ldb, size_t steps, size_t a_step_bytes, size_t cols,
                                  float* c, size_t ldc) {
  const auto* a_bytes = static_cast<const char*>(a);
  for (size_t r = 0; r < rows; r += 32) {
    const bool two_rows = r + 32 <= rows;
    const char* ar = a_bytes + r * lda_bytes;
    float* cr = c + r * ldc;
    size_t x = 0;
    for (; x + 32 <= cols; x += 32) {
      if (two_rows)
        Block<2, 2, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
      else
        Block<1, 2, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
    }
    if (x < cols) {
      if (two_rows)
        Block<2, 1, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
      else
        Block<1, 1, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
    }
  }
}

}  // namespace

bool available() {
  return amx_allowed() && amx_available();
}

HEADLIGHT_AMX_TARGET void product(const bf16* a, size_t lda, size_t rows, const uint32_t* b,
                                  size_t ldb, size_t steps, size_t cols, float* c, size_t ldc,
                                  bool accumulate) {
  if (accumulate)
    Product<true>(a, lda * sizeof(bf16), rows, b, ldb, steps, 64, cols, c, ldc);
  else
    Product<false>(a, lda * sizeof(bf16), rows, b, ldb, steps, 64, cols, c, ldc);
}

HEADLIGHT_AMX_TARGET void row_pairs(const float* x, size_t ldx, size_t rows, size_t rows_pad,
                                    size_t cols, uint32_t* dst, size_t ld) {
  const __m512 zero = _mm512_setzero_ps();
  for (size_t i = 0; i < rows_pad / 2; ++i) {
    const float* x0 = 2 * i < rows ? x + 2 * i * ldx : nullptr;
    const float* x1 = 2 * i + 1 < rows ? x + (2 * i + 1) * ldx : nullptr;
    uint32_t* out = dst + i * ld;
    for (size_t c = 0; c < cols; c += 16) {
      const __m256bh lo = _mm512_cvtneps_pbh(x0 ? _mm512_loadu_ps(x0 + c) : zero);
      const __m256bh hi = _mm512_cvtneps_pbh(x1 ? _mm512_loadu_ps(x1 + c) : zero);
      const __m512i words =
          _mm512_or_si512(_mm512_cvtepu16_epi32((__m256i)lo),
                          _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16));
      _mm512_storeu_si512(out + c, words);
    }
  }
}

HEADLIGHT_AMX_TARGET void qk_tile(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt,
                                  size_t ldk, size_t pairs, size_t cols, float scale, float* s,
                                  size_t lds) {
  // A step is 16 pair words of each query row (64 bytes).
  Product<false>(q, ldq * sizeof(uint32_t), rows, kt, ldk, pairs / 16, 64, cols, s, lds);
  if (scale == 1.0f) return;
  const __m512 vs = _mm512_set1_ps(scale);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; c += 16)
      _mm512_storeu_ps(s + r * lds + c, _mm512_mul_ps(_mm512_loadu_ps(s + r * lds + c), vs));
}

HEADLIGHT_AMX_TARGET void pv_tile(const bf16* p, size_t ldp, size_t rows, size_t pairs,
                                  const uint32_t* v, size_t ldv, size_t width, float* o, size_t ldo,
                                  const float* alpha) {
  if (alpha)
    for (size_t r = 0; r < rows; ++r) {
      if (alpha[r] == 1.0f) continue;  // the row's maximum did not move (most rows, after a while)
      const __m512 a = _mm512_set1_ps(alpha[r]);
      for (size_t x = 0; x < width; x += 16)
        _mm512_storeu_ps(o + r * ldo + x, _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + x), a));
    }
  // The scaling left the upper halves of the vector registers dirty, and the product below (a
  // tail call the compiler would make) touches none, so nothing else would clear them: without
  // this the caller's SSE code (the per-row epilogue, libm's log) ran at a fraction of its speed.
  _mm256_zeroupper();
  // A step is 32 keys of each probability row (64 bytes).
  Product<true>(p, ldp * sizeof(bf16), rows, v, ldv, pairs / 16, 64, width, o, ldo);
}

// 2^t for t ≤ 0 (t may be −inf, NaN propagates), in seven instructions: t = n + f with n = ⌊t⌋
// and f = t − n ∈ [0, 1) (vreduceps, rounding down), 2^f from a degree-4 polynomial, and 2^n
// applied by vscalefps, which scales by 2^⌊t⌋ itself, so n is never formed. The polynomial is
// exact at both ends (2^0 = 1, 2^1 = 2: a row's maximum weighs exactly 1, also when rounding puts
// t a hair below 0) with relative error < 3.5·10⁻⁶ between (fitted on [0, 1), float arithmetic):
// the weights are rounded to bf16 for P·V (half-ulp 2·10⁻³), and the log-sum-exp, from the fp32
// sums, stays within 10⁻⁵. Below −126 (and for −inf: masked keys) the result is exactly 0: those
// lanes are zeroed by the scalef's mask rather than computed, because a denormal result (and the
// sums of denormals after it) costs a microcode assist of a hundred cycles or more; from −126 up
// the result is a normal number.
HEADLIGHT_AMX_TARGET inline __m512 Exp2(__m512 t) {
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);  // or NaN
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF);
  __m512 p = _mm512_set1_ps(1.35557475e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.20323701e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.41379768e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93032146e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, t);
}

HEADLIGHT_AMX_TARGET void softmax_rows(float* s, size_t rows, size_t cols, size_t lds, float* m,
                                       float* l, float* alpha, float scale, bf16* pb, size_t ldpb) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr size_t kMaxRows = 256;
  const float ninf = -__builtin_inff(), qnan = __builtin_nanf("");
  alignas(64) float tile_max[kMaxRows + 16], m_new[kMaxRows + 16];
  // A: per row, the tile maximum (scaled) and whether a NaN is present (one unordered compare
  // checks two vectors).
  for (size_t r = 0; r < rows; ++r) {
    const float* row = s + r * lds;
    __m512 vmax0 = _mm512_set1_ps(ninf), vmax1 = vmax0;
    __mmask16 nan = 0;
    size_t c = 0;
    for (; c + 32 <= cols; c += 32) {
      const __m512 x0 = _mm512_loadu_ps(row + c), x1 = _mm512_loadu_ps(row + c + 16);
      vmax0 = _mm512_max_ps(vmax0, x0);
      vmax1 = _mm512_max_ps(vmax1, x1);
      nan |= _mm512_cmp_ps_mask(x0, x1, _CMP_UNORD_Q);
    }
    if (c < cols) {
      const __m512 x = _mm512_loadu_ps(row + c);
      vmax0 = _mm512_max_ps(vmax0, x);
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    tile_max[r] = nan ? qnan : _mm512_reduce_max_ps(_mm512_max_ps(vmax0, vmax1)) * scale;
  }
  // B: 16 rows at a time, the new maxima and α = 2^(m·log2 e − m'·log2 e) (the products rounded
  // as in C); a NaN in either makes both NaN, and α = 1 while no key is allowed.
  for (size_t r = rows; r < (rows + 15) / 16 * 16; ++r) tile_max[r] = ninf;
  const __m512 l2e = _mm512_set1_ps(kLog2e), vninf = _mm512_set1_ps(ninf);
  for (size_t r = 0; r < rows; r += 16) {
    const __mmask16 valid =
        rows - r >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (rows - r)) - 1);
    const __m512 mo = _mm512_mask_loadu_ps(vninf, valid, m + r);
    const __m512 tm = _mm512_load_ps(tile_max + r);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(mo, tm, _CMP_UNORD_Q);
    const __m512 mn = _mm512_mask_blend_ps(is_nan, _mm512_max_ps(mo, tm), _mm512_set1_ps(qnan));
    __m512 al = Exp2(_mm512_sub_ps(_mm512_mul_ps(mo, l2e), _mm512_mul_ps(mn, l2e)));
    al = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, vninf, _CMP_EQ_OQ), al, _mm512_set1_ps(1.0f));
    al = _mm512_mask_blend_ps(is_nan, al, _mm512_set1_ps(qnan));
    _mm512_mask_storeu_ps(m + r, valid, mn);
    _mm512_mask_storeu_ps(alpha + r, valid, al);
    _mm512_store_ps(m_new + r, mn);
  }
  // C: P = 2^(s·scale·log2 e − m'·log2 e), its running sum per lane, and P rounded to bf16; four
  // vectors per step, so that four exponentials' dependency chains overlap.
  const __m512 vc = _mm512_set1_ps(scale * kLog2e);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = s + r * lds;
    const float mn = m_new[r];
    auto* out = reinterpret_cast<char*>(pb + r * ldpb);
    float* lr = l + r * 16;
    if (mn == ninf) {  // no allowed key yet: P = 0, and the sums stay (α = 1)
      for (size_t c = 0; c < cols; c += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * c), _mm256_setzero_si256());
      continue;
    }
    const __m512 vml = _mm512_set1_ps(mn * kLog2e);
    auto p_at = [&](size_t c) HEADLIGHT_AMX_TARGET {
      return Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(row + c), vc, vml));
    };
    __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0, sum2 = sum0, sum3 = sum0;
    size_t c = 0;
    for (; c + 64 <= cols; c += 64) {
      const __m512 p0 = p_at(c), p1 = p_at(c + 16), p2 = p_at(c + 32), p3 = p_at(c + 48);
      sum0 = _mm512_add_ps(sum0, p0);
      sum1 = _mm512_add_ps(sum1, p1);
      sum2 = _mm512_add_ps(sum2, p2);
      sum3 = _mm512_add_ps(sum3, p3);
      _mm512_storeu_si512(out + 2 * c, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
      _mm512_storeu_si512(out + 2 * c + 64, (__m512i)_mm512_cvtne2ps_pbh(p3, p2));
    }
    for (; c + 32 <= cols; c += 32) {
      const __m512 p0 = p_at(c), p1 = p_at(c + 16);
      sum0 = _mm512_add_ps(sum0, p0);
      sum1 = _mm512_add_ps(sum1, p1);
      _mm512_storeu_si512(out + 2 * c, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    if (c < cols) {
      const __m512 p0 = p_at(c);
      sum2 = _mm512_add_ps(sum2, p0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * c), (__m256i)_mm512_cvtneps_pbh(p0));
    }
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(sum0, sum1), _mm512_add_ps(sum2, sum3));
    _mm512_storeu_ps(lr, _mm512_fmadd_ps(_mm512_set1_ps(alpha[r]), _mm512_loadu_ps(lr), sum));
  }
}

}  // namespace headlight::attention::cpu::kernels::amx

#else  // not x86-64: no AMX

namespace headlight::attention::cpu::kernels::amx {

bool available() {
  return false;
}
void qk_tile(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float,
             float*, size_t) {
  fail("amx::qk_tile: no AMX on this architecture");
}
void pv_tile(const bf16*, size_t, size_t, size_t, const uint32_t*, size_t, size_t, float*, size_t,
             const float*) {
  fail("amx::pv_tile: no AMX on this architecture");
}
void softmax_rows(float*, size_t, size_t, size_t, float*, float*, float*, float, bf16*, size_t) {
  fail("amx::softmax_rows: no AMX on this architecture");
}
void product(const bf16*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float*, size_t,
             bool) {
  fail("amx::product: no AMX on this architecture");
}
void row_pairs(const float*, size_t, size_t, size_t, size_t, uint32_t*, size_t) {
  fail("amx::row_pairs: no AMX on this architecture");
}

}  // namespace headlight::attention::cpu::kernels::amx

#endif

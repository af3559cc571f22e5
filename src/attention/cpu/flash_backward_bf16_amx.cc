// The bf16 backward's score tiles on AMX, each in one pass (flash_backward_bf16.cc runs them on a
// tile without dropout, soft-cap or element masks; the others take the unfused path):
//
//   backward_probs    S = scale · Q · Kᵀ, then P = 2^(S · log2 e − lse · log2 e) for the keys
//                     below each row's limit (0 past it): P in fp32 into p, for the softmax
//                     gradient, and its row pairs into pw, the B operand of dVᵀ += dOᵀ · P.
//   backward_dscores  dP = dO · Vᵀ, then dS = P ⊙ (dP − δ) with δ = rowsum(dO ⊙ O), rounded to
//                     bf16: its row pairs into pw, the B operand of dKᵀ += Qᵀ · dS, and its rows
//                     into ds, the A operand of dQ += dS · K.
//
// Tiling: the products run in 2 × 2 blocks of tiles (32 rows × 32 keys; amx::tiles::Block), each
// block stored into a 4 KiB buffer that stays in L1 and turned into P or dS at once, row pair by
// row pair, as the forward's qk_exp_tile does. The unfused path stores S and dP whole into [128,
// 256] fp32 tiles (128 KiB each, in L2: a tile store into L2 stalls the matrix unit about four
// times as long as one into L1, flash_bf16_amx.cc) and reads them back in five vector passes:
// exp_shift_rows, softmax_grad_tile, round_tile_bf16 and row_pairs twice. Here S and dP never
// leave L1; what goes through L2 is P in fp32 (written once, read once by backward_dscores) and
// the bf16 operands of the next products.
//
// The bits are the unfused path's: per element the same instructions in the same order (S · scale,
// then fmsub and native::Exp2; dP − δ, then · P; vcvtneps2bf16), the keys past a row's limit 0, a
// row whose lse is −inf all 0 and one whose lse is NaN NaN (up to the tile's padded columns), and
// rows past `rows` and keys past `cols` 0 in every output.

#include "src/attention/cpu/flash_bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#include "src/attention/cpu/amx_block.h"
#include "src/attention/cpu/bf16_target.h"  // Exp2, kLog2e

// GCC 12's AVX-512 intrinsics pass an uninitialised _mm512_undefined_*() as the unused merge
// operand, which -W(maybe-)uninitialized reports wherever they are inlined: silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace headlight::attention::cpu::kernels::amx {
namespace {

using tiles::Block;

// Two rows' 16 floats as the pair words (bf16(a), bf16(b)): native::row_pairs's words.
HEADLIGHT_AMX_TARGET inline __m512i PairWords(__m512 a, __m512 b) {
  const __m256bh lo = _mm512_cvtneps_pbh(a), hi = _mm512_cvtneps_pbh(b);
  return _mm512_or_si512(_mm512_cvtepu16_epi32((__m256i)lo),
                         _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16));
}

// The lanes of the 16 keys from x that lie below `limit`.
inline __mmask16 Below(size_t x, size_t limit) {
  if (limit >= x + 16) return 0xFFFF;
  return limit > x ? static_cast<__mmask16>((1u << (limit - x)) - 1) : 0;
}

// The 2 × 2 block of c = a · b at rows r0 (two row tiles, or one where rows16 ends) and keys x
// into buf [32, 32]; a pair words [rows, lda], b pair words [pairs, ldb]. Returns the block's rows.
HEADLIGHT_AMX_TARGET inline size_t BlockAt(const uint32_t* a, size_t lda, size_t rows16,
                                           const uint32_t* b, size_t ldb, size_t steps, size_t r0,
                                           size_t x, float* buf) {
  const auto* ar = reinterpret_cast<const char*>(a + r0 * lda);
  if (r0 + 32 <= rows16) {
    Block<2, 2, false>(ar, lda * sizeof(uint32_t), b + x, ldb, steps, 64, buf, 32);
    return 32;
  }
  Block<1, 2, false>(ar, lda * sizeof(uint32_t), b + x, ldb, steps, 64, buf, 32);
  return 16;
}

// The pair rows of rows16 .. rows32 (a last lone row tile's partners), zero as row_pairs writes
// them.
HEADLIGHT_AMX_TARGET inline void ZeroPairRows(size_t rows16, size_t rows32, size_t cols32,
                                              uint32_t* pw, size_t ldw) {
  for (size_t i = rows16 / 2; i < rows32 / 2; ++i)
    for (size_t x = 0; x < cols32; x += 16)
      _mm512_storeu_si512(pw + i * ldw + x, _mm512_setzero_si512());
}

}  // namespace

HEADLIGHT_AMX_TARGET void backward_probs(const uint32_t* q, size_t ldq, size_t rows,
                                         const uint32_t* kt, size_t ldk, size_t pairs, size_t cols,
                                         size_t keys, const int32_t* limits, float scale,
                                         const float* lse, float* p, size_t ldp, uint32_t* pw,
                                         size_t ldw) {
  alignas(64) float buf[32 * 32];  // one block's scores [32 rows, 32 keys], in L1
  const size_t rows16 = (rows + 15) / 16 * 16, rows32 = (rows + 31) / 32 * 32;
  const size_t cols32 = (cols + 31) / 32 * 32, steps = pairs / 16;
  const __m512 vs = _mm512_set1_ps(scale), l2e = _mm512_set1_ps(native::kLog2e);
  for (size_t r0 = 0; r0 < rows16; r0 += 32)
    for (size_t x = 0; x < cols32; x += 32) {
      const size_t n = BlockAt(q, ldq, rows16, kt, ldk, steps, r0, x, buf);
      for (size_t i = 0; i < n; i += 2) {
        __m512 v[2][2];  // P of the pair's [row][16 keys]
        for (size_t k = 0; k < 2; ++k) {
          const size_t r = r0 + i + k;
          v[k][0] = v[k][1] = _mm512_setzero_ps();
          if (r >= rows) continue;
          const float l = lse[r];
          if (l != l) {  // a NaN row: NaN up to the padded columns (exp_shift_rows' fill)
            for (size_t h = 0; h < 2; ++h)
              v[k][h] = _mm512_maskz_mov_ps(Below(x + 16 * h, cols), _mm512_set1_ps(l));
          } else if (l > -__builtin_inff()) {
            const size_t lim =
                limits ? std::min(cols, static_cast<size_t>(std::max(limits[r], 0))) : keys;
            const __m512 shift = _mm512_set1_ps(l * native::kLog2e);
            for (size_t h = 0; h < 2; ++h) {
              const __m512 s = _mm512_mul_ps(_mm512_load_ps(buf + (i + k) * 32 + 16 * h), vs);
              v[k][h] = _mm512_maskz_mov_ps(Below(x + 16 * h, lim),
                                            native::Exp2(_mm512_fmsub_ps(s, l2e, shift)));
            }
          }
          _mm512_storeu_ps(p + r * ldp + x, v[k][0]);
          _mm512_storeu_ps(p + r * ldp + x + 16, v[k][1]);
        }
        uint32_t* out = pw + (r0 + i) / 2 * ldw + x;
        _mm512_storeu_si512(out, PairWords(v[0][0], v[1][0]));
        _mm512_storeu_si512(out + 16, PairWords(v[0][1], v[1][1]));
      }
    }
  ZeroPairRows(rows16, rows32, cols32, pw, ldw);
  _mm256_zeroupper();
}

HEADLIGHT_AMX_TARGET void backward_dscores(const uint32_t* dout, size_t ldd, size_t rows,
                                           const uint32_t* vt, size_t ldv, size_t pairs,
                                           size_t cols, const float* p, size_t ldp,
                                           const float* dot, uint32_t* pw, size_t ldw, bf16* ds,
                                           size_t ldds) {
  alignas(64) float buf[32 * 32];  // one block's dP [32 rows, 32 keys], in L1
  const size_t rows16 = (rows + 15) / 16 * 16, rows32 = (rows + 31) / 32 * 32;
  const size_t cols32 = (cols + 31) / 32 * 32, steps = pairs / 16;
  for (size_t r0 = 0; r0 < rows16; r0 += 32)
    for (size_t x = 0; x < cols32; x += 32) {
      const size_t n = BlockAt(dout, ldd, rows16, vt, ldv, steps, r0, x, buf);
      const __mmask16 m0 = Below(x, cols), m1 = Below(x + 16, cols);
      for (size_t i = 0; i < n; i += 2) {
        __m512 v[2][2];  // dS of the pair's [row][16 keys]
        for (size_t k = 0; k < 2; ++k) {
          const size_t r = r0 + i + k;
          v[k][0] = v[k][1] = _mm512_setzero_ps();
          if (r < rows) {  // softmax_grad_tile's dS = P · (dP − δ)
            const __m512 d = _mm512_set1_ps(dot[r]);
            const float* pr = p + r * ldp + x;
            const float* dp = buf + (i + k) * 32;
            v[k][0] =
                _mm512_maskz_mul_ps(m0, _mm512_loadu_ps(pr), _mm512_sub_ps(_mm512_load_ps(dp), d));
            v[k][1] = _mm512_maskz_mul_ps(m1, _mm512_loadu_ps(pr + 16),
                                          _mm512_sub_ps(_mm512_load_ps(dp + 16), d));
          }
          _mm512_storeu_si512(ds + r * ldds + x, (__m512i)_mm512_cvtne2ps_pbh(v[k][1], v[k][0]));
        }
        uint32_t* out = pw + (r0 + i) / 2 * ldw + x;
        _mm512_storeu_si512(out, PairWords(v[0][0], v[1][0]));
        _mm512_storeu_si512(out + 16, PairWords(v[0][1], v[1][1]));
      }
    }
  ZeroPairRows(rows16, rows32, cols32, pw, ldw);
  _mm256_zeroupper();
}

}  // namespace headlight::attention::cpu::kernels::amx

#else  // not x86-64: no AMX

#include "headlight/core/error.h"

namespace headlight::attention::cpu::kernels::amx {

void backward_probs(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t,
                    size_t, const int32_t*, float, const float*, float*, size_t, uint32_t*,
                    size_t) {
  fail("amx::backward_probs: no AMX on this architecture");
}
void backward_dscores(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t,
                      const float*, size_t, const float*, uint32_t*, size_t, bf16*, size_t) {
  fail("amx::backward_dscores: no AMX on this architecture");
}

}  // namespace headlight::attention::cpu::kernels::amx

#endif

// The bf16 backward's score tiles on AMX in one pass (amx::backward_tile; flash_backward_bf16.cc
// runs it on a tile without dropout, soft-cap or element masks, the others take the unfused path).
// For each 2 × 2 block of tiles (32 rows × 32 keys; amx::tiles::Block):
//
//   S  = scale · Q · Kᵀ  into a 4 KiB buffer in L1, then at once
//   P  = 2^(S · log2 e − lse · log2 e) for the keys below each row's limit (0 past it), kept in a
//        second 4 KiB buffer, its row pairs out (the B operand of dVᵀ += dOᵀ · P);
//   dP = dO · Vᵀ into the first buffer, then at once
//   dS = P ⊙ (dP − δ), δ = rowsum(dO ⊙ O), rounded to bf16: its row pairs out (the B operand of
//        dKᵀ += Qᵀ · dS) and its rows (the A operand of dQ += dS · K).
//
// The unfused path stores S and dP whole into [128, 256] fp32 tiles (128 KiB each, in L2: a tile
// store into L2 stalls the matrix unit about four times as long as one into L1,
// flash_bf16_amx.cc) and reads them back in five vector passes (exp_shift_rows, softmax_grad_tile,
// round_tile_bf16, row_pairs twice). Here S, P and dP never leave L1; what goes to L2 is the three
// bf16 operands of the tile's next products, 6 bytes a score. Against the unfused path, N = 2048,
// 8 heads (binaries alternated, medians of 5): D = 64 17.2 → 13.5 ms, D = 128 27.5 → 24.4, causal
// D = 64 10.0 → 8.1. (S → P and dP → dS as two passes, P through L2 in fp32 between them, had
// been 2–3% slower at D = 64 and as fast at D = 128.)
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
#include "src/attention/cpu/bf16_target.h"  // Exp2, kLog2e; -W(maybe-)uninitialized silenced

namespace headlight::attention::cpu::kernels::amx {
namespace {

using tiles::Block;

using native::PairWords;

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

HEADLIGHT_AMX_TARGET void backward_tile(const BackwardTile& t) {
  alignas(64) float buf[32 * 32];  // one block's S, then its dP [32 rows, 32 keys]
  alignas(64) float pb[32 * 32];   // the block's P
  const size_t rows = t.rows, cols = t.cols;
  const size_t rows16 = (rows + 15) / 16 * 16, rows32 = (rows + 31) / 32 * 32;
  const size_t cols32 = (cols + 31) / 32 * 32;
  const __m512 vs = _mm512_set1_ps(t.scale), l2e = _mm512_set1_ps(native::kLog2e);
  for (size_t r0 = 0; r0 < rows16; r0 += 32)
    for (size_t x = 0; x < cols32; x += 32) {
      // S, then P (exp_shift_rows' bits) into pb and its row pairs.
      const size_t n = BlockAt(t.q, t.ldq, rows16, t.kt, t.ldk, t.q_pairs / 16, r0, x, buf);
      for (size_t i = 0; i < n; ++i) {
        const size_t r = r0 + i;
        __m512 v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
        const float l = r < rows ? t.lse[r] : -__builtin_inff();
        if (l != l) {  // a NaN row: NaN up to the padded columns (exp_shift_rows' fill)
          v0 = _mm512_maskz_mov_ps(Below(x, cols), _mm512_set1_ps(l));
          v1 = _mm512_maskz_mov_ps(Below(x + 16, cols), _mm512_set1_ps(l));
        } else if (l > -__builtin_inff()) {
          const size_t lim =
              t.limits ? std::min(cols, static_cast<size_t>(std::max(t.limits[r], 0))) : t.keys;
          const __m512 shift = _mm512_set1_ps(l * native::kLog2e);
          const __m512 s0 = _mm512_mul_ps(_mm512_load_ps(buf + i * 32), vs);
          const __m512 s1 = _mm512_mul_ps(_mm512_load_ps(buf + i * 32 + 16), vs);
          v0 = _mm512_maskz_mov_ps(Below(x, lim), native::Exp2(_mm512_fmsub_ps(s0, l2e, shift)));
          v1 = _mm512_maskz_mov_ps(Below(x + 16, lim),
                                   native::Exp2(_mm512_fmsub_ps(s1, l2e, shift)));
        }
        _mm512_store_ps(pb + i * 32, v0);
        _mm512_store_ps(pb + i * 32 + 16, v1);
      }
      for (size_t i = 0; i < n; i += 2) {
        uint32_t* out = t.p_pairs + (r0 + i) / 2 * t.ldw + x;
        const float* p0 = pb + i * 32;
        _mm512_storeu_si512(out, PairWords(_mm512_load_ps(p0), _mm512_load_ps(p0 + 32)));
        _mm512_storeu_si512(out + 16, PairWords(_mm512_load_ps(p0 + 16), _mm512_load_ps(p0 + 48)));
      }
      // dP, then dS = P · (dP − δ) (softmax_grad_tile's bits), rounded: row pairs and rows.
      BlockAt(t.dout, t.ldd, rows16, t.vt, t.ldv, t.v_pairs / 16, r0, x, buf);
      const __mmask16 m0 = Below(x, cols), m1 = Below(x + 16, cols);
      for (size_t i = 0; i < n; i += 2) {
        __m512 v[2][2];  // dS of the pair's [row][16 keys]
        for (size_t k = 0; k < 2; ++k) {
          const size_t r = r0 + i + k;
          v[k][0] = v[k][1] = _mm512_setzero_ps();
          if (r < rows) {
            const __m512 d = _mm512_set1_ps(t.dot[r]);
            const float* pr = pb + (i + k) * 32;
            const float* dp = buf + (i + k) * 32;
            v[k][0] =
                _mm512_maskz_mul_ps(m0, _mm512_load_ps(pr), _mm512_sub_ps(_mm512_load_ps(dp), d));
            v[k][1] = _mm512_maskz_mul_ps(m1, _mm512_load_ps(pr + 16),
                                          _mm512_sub_ps(_mm512_load_ps(dp + 16), d));
          }
          _mm512_storeu_si512(t.ds + r * t.ldds + x,
                              (__m512i)_mm512_cvtne2ps_pbh(v[k][1], v[k][0]));
        }
        uint32_t* out = t.ds_pairs + (r0 + i) / 2 * t.ldw + x;
        _mm512_storeu_si512(out, PairWords(v[0][0], v[1][0]));
        _mm512_storeu_si512(out + 16, PairWords(v[0][1], v[1][1]));
      }
    }
  ZeroPairRows(rows16, rows32, cols32, t.p_pairs, t.ldw);
  ZeroPairRows(rows16, rows32, cols32, t.ds_pairs, t.ldw);
  _mm256_zeroupper();
}

}  // namespace headlight::attention::cpu::kernels::amx

#else  // not x86-64: no AMX

#include "headlight/core/error.h"

namespace headlight::attention::cpu::kernels::amx {

void backward_tile(const BackwardTile&) {
  fail("amx::backward_tile: no AMX on this architecture");
}

}  // namespace headlight::attention::cpu::kernels::amx

#endif

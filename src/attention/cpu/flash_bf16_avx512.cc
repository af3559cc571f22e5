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
//
// softmax_rows is the online softmax of both bf16 engines (this one and AMX, flash_bf16_amx.cc):
// per 16 scores a seven-instruction 2^t (vreduceps for the fraction, vscalefps for the power of
// two), the running sums in fp32 and the probabilities rounded to bf16 by vcvtne2ps2bf16 into the
// rows P·V reads; with lr also the sums of those rounded probabilities (a vdpbf16ps of each 32
// by the pair (1, 1)), which the output is divided by. Its reference maximum is lazy
// (flash_bf16.h): a pass over the scores for their maxima, 2.6 of 8.7 cycles per 16 scores on
// Sapphire Rapids (the scores read from L2 twice), is spent only on rows that have none yet;
// N = 2048, 8 heads, AMX, 2 threads: D = 64 7.6 → 6.7 ms, D = 128 10.7 → 9.8. It is about half
// the instructions of the portable loop (flash_kernels-inl.h); on the Zen 4 machine of 2026-12-05
// it took the vdpbf16ps forward at N = 2048, D = 64 from 311 to 348 GFLOP/s (0.66 → 0.74 of the
// vdpbf16ps peak).
//
// decode_scores_bf16 and decode_pv_bf16 are decode's loops over a bf16 cache read where it lies
// (no packing: decode reads each key and value once, from memory). The scores keep up to 4 query
// rows in registers and read each key row once for all of them; P·V interleaves two value rows in
// registers into the pair words vdpbf16ps multiplies. Half the instructions of widening each
// element to fp32: 32 heads over 8, D = 128, 4,096 keys went 0.75 → 0.64 ms, within reach of what
// the memory gives that access pattern (docs/notes/2026-12-05-decode-without-prefetch.md).

#include <algorithm>
#include <cstring>

#include "src/attention/cpu/flash_bf16.h"
#include "src/attention/cpu/flash_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "src/attention/cpu/bf16_target.h"

namespace headlight::attention::cpu::kernels::native {
namespace {

template <size_t R, size_t NV>
HEADLIGHT_BF16_TARGET inline void QkMicro(const uint32_t* q, size_t ldq, const uint32_t* kt,
                                          size_t ldk, size_t pairs, float scale, float* s,
                                          size_t lds) {
  __m512 acc[R][NV];
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
  for (size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (size_t e = 0; e < pairs; ++e) {
    __m512bh k[NV];
    HEADLIGHT_UNROLL
    for (size_t v = 0; v < NV; ++v) k[v] = (__m512bh)_mm512_loadu_si512(kt + e * ldk + v * 16);
    HEADLIGHT_UNROLL
    for (size_t r = 0; r < R; ++r) {
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * ldq + e]));
      HEADLIGHT_UNROLL
      for (size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qv, k[v]);
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
  for (size_t v = 0; v < NV; ++v)
    _mm512_storeu_ps(s + r * lds + v * 16, _mm512_mul_ps(acc[r][v], vs));
}

template <size_t R>
HEADLIGHT_BF16_TARGET inline void QkRows(const uint32_t* q, size_t ldq, const uint32_t* kt,
                                         size_t ldk, size_t pairs, size_t cols, float scale,
                                         float* s, size_t lds) {
  size_t c = 0;
  for (; c + 64 <= cols; c += 64) QkMicro<R, 4>(q, ldq, kt + c, ldk, pairs, scale, s + c, lds);
  // The rest of the keys (16, 32 or 48: on a diagonal, a block's last keys) in one pass.
  if (cols - c == 48)
    QkMicro<R, 3>(q, ldq, kt + c, ldk, pairs, scale, s + c, lds);
  else if (cols - c == 32)
    QkMicro<R, 2>(q, ldq, kt + c, ldk, pairs, scale, s + c, lds);
  else if (cols - c == 16)
    QkMicro<R, 1>(q, ldq, kt + c, ldk, pairs, scale, s + c, lds);
}

template <size_t R, size_t NV>
HEADLIGHT_BF16_TARGET inline void PvMicro(const uint32_t* p, size_t ldp, size_t pairs,
                                          const uint32_t* v, size_t ldv, float* o, size_t ldo,
                                          const float* alpha) {
  __m512 acc[R][NV];
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) {
    const __m512 al = _mm512_set1_ps(alpha ? alpha[r] : 1.0f);
    HEADLIGHT_UNROLL
    for (size_t x = 0; x < NV; ++x)
      acc[r][x] = _mm512_mul_ps(al, _mm512_loadu_ps(o + r * ldo + x * 16));
  }
  for (size_t c = 0; c < pairs; ++c) {
    __m512bh vv[NV];
    HEADLIGHT_UNROLL
    for (size_t x = 0; x < NV; ++x) vv[x] = (__m512bh)_mm512_loadu_si512(v + c * ldv + x * 16);
    HEADLIGHT_UNROLL
    for (size_t r = 0; r < R; ++r) {
      const __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[r * ldp + c]));
      HEADLIGHT_UNROLL
      for (size_t x = 0; x < NV; ++x) acc[r][x] = _mm512_dpbf16_ps(acc[r][x], pv, vv[x]);
    }
  }
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
  for (size_t x = 0; x < NV; ++x) _mm512_storeu_ps(o + r * ldo + x * 16, acc[r][x]);
}

template <size_t R>
HEADLIGHT_BF16_TARGET inline void PvRows(const uint32_t* p, size_t ldp, size_t pairs,
                                         const uint32_t* v, size_t ldv, size_t width, float* o,
                                         size_t ldo, const float* alpha) {
  size_t x = 0;
  for (; x + 64 <= width; x += 64) PvMicro<R, 4>(p, ldp, pairs, v + x, ldv, o + x, ldo, alpha);
  // A 32-wide rest (head dim 32, 96) in one pass: two loaded vectors per broadcast, not one.
  if (x + 32 <= width) {
    PvMicro<R, 2>(p, ldp, pairs, v + x, ldv, o + x, ldo, alpha);
    x += 32;
  }
  for (; x < width; x += 16) PvMicro<R, 1>(p, ldp, pairs, v + x, ldv, o + x, ldo, alpha);
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
  ForRowBlocks<6, QkBlock>(rows, q, ldq, kt, ldk, pairs, cols, scale, s, lds);
}

HEADLIGHT_BF16_TARGET void pv_tile_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t pairs,
                                        const uint32_t* v, size_t ldv, size_t width, float* o,
                                        size_t ldo, const float* alpha) {
  ForRowBlocks<6, PvBlock>(rows, p, ldp, pairs, v, ldv, width, o, ldo, alpha);
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

HEADLIGHT_BF16_TARGET void row_pairs(const float* x, size_t ldx, size_t rows, size_t rows_pad,
                                     size_t cols, uint32_t* dst, size_t ld) {
  const __m512 zero = _mm512_setzero_ps();
  for (size_t i = 0; i < rows_pad / 2; ++i) {
    const float* x0 = 2 * i < rows ? x + 2 * i * ldx : nullptr;
    const float* x1 = 2 * i + 1 < rows ? x + (2 * i + 1) * ldx : nullptr;
    uint32_t* out = dst + i * ld;
    for (size_t c = 0; c < cols; c += 16)
      _mm512_storeu_si512(out + c, PairWords(x0 ? _mm512_loadu_ps(x0 + c) : zero,
                                             x1 ? _mm512_loadu_ps(x1 + c) : zero));
  }
}

// Lane r of the result = the maximum of v[r]'s 16 lanes: four levels, each halving the vectors
// by pairing blocks (vshuff32x4, then vshufps within blocks) and taking the maxima, 45
// instructions for 16 rows where one row's own reduction takes about eight; the last level leaves
// the rows in the order kRows, which one permutation undoes.
HEADLIGHT_BF16_TARGET inline __m512 RowMaxima(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // blocks [row i: 2, row i + 8: 2], each a partial of 4 lanes
    t[i] = _mm512_max_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[i], v[i + 8], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)  // blocks [rows i, i + 8, i + 4, i + 12], 4 lanes each
    u[i] = _mm512_max_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t[i], t[i + 4], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // per block, two rows of 2 lanes
    w[i] = _mm512_max_ps(_mm512_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 z = _mm512_max_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Lane l of z holds row kRows[l]; the permutation is its own inverse.
  const __m512i kRows = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(kRows, z);
}

// out[16] = α · out + the per-lane sums of one row of P as rounded (cols bf16 values, a multiple
// of 16): each pair word times the pair (1, 1) by vdpbf16ps (lane i adds the rounded
// probabilities 2i and 2i + 1 of each 32; their products by 1 are exact), in two running sums.
HEADLIGHT_BF16_TARGET inline void AddRoundedSums(const bf16* row, size_t cols, float alpha,
                                                 float* out) {
  const __m512bh ones = (__m512bh)_mm512_set1_epi32(0x3F803F80);
  const auto* w = reinterpret_cast<const char*>(row);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  size_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + 2 * c), ones);
    a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + 2 * c + 64), ones);
  }
  if (c + 32 <= cols) {
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + 2 * c), ones);
    c += 32;
  }
  if (c < cols)
    a1 = _mm512_dpbf16_ps(a1,
                          (__m512bh)_mm512_zextsi256_si512(
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2 * c))),
                          ones);
  _mm512_storeu_ps(
      out, _mm512_fmadd_ps(_mm512_set1_ps(alpha), _mm512_loadu_ps(out), _mm512_add_ps(a0, a1)));
}

HEADLIGHT_BF16_TARGET void softmax_rows(float* s, size_t rows, size_t cols, size_t lds, float* m,
                                        float* l, float* alpha, float scale, bf16* pb, size_t ldpb,
                                        const int32_t* row_cols, float* lr) {
  constexpr size_t kMaxRows = kSoftmaxRowsPerCall;
  for (; rows > kMaxRows; rows -= kMaxRows) {  // rows are independent: kMaxRows at a time
    softmax_rows(s, kMaxRows, cols, lds, m, l, alpha, scale, pb, ldpb, row_cols, lr);
    s += kMaxRows * lds, m += kMaxRows, l += kMaxRows * 16, alpha += kMaxRows,
        pb += kMaxRows * ldpb;
    if (row_cols) row_cols += kMaxRows;
    if (lr) lr += kMaxRows * 16;
  }
  const float ninf = -__builtin_inff(), qnan = __builtin_nanf("");
  const __m512 vninf = _mm512_set1_ps(ninf);
  alignas(64) float tile_max[kMaxRows + 16], m_new[kMaxRows + 16];
  // Row r's scores past its limit (row_cols[r], else cols) are not read: −inf, as the masks make
  // them, so the same bits. x(row, c): the vector at c, −inf in the lanes past the limit.
  auto limit = [&](size_t r) {
    return row_cols ? std::min(cols, static_cast<size_t>(std::max(row_cols[r], 0))) : cols;
  };
  auto x_at = [&](const float* row, size_t c, size_t lim) HEADLIGHT_BF16_TARGET {
    if (c + 16 <= lim) return _mm512_loadu_ps(row + c);
    if (c >= lim) return vninf;
    return _mm512_mask_loadu_ps(vninf, static_cast<__mmask16>((1u << (lim - c)) - 1), row + c);
  };
  auto row_max = [&](const float* row, size_t lim) HEADLIGHT_BF16_TARGET {  // its lanes' maxima
    __m512 vmax0 = vninf, vmax1 = vmax0;
    size_t c = 0;
    for (; c + 32 <= lim; c += 32) {
      vmax0 = _mm512_max_ps(vmax0, _mm512_loadu_ps(row + c));
      vmax1 = _mm512_max_ps(vmax1, _mm512_loadu_ps(row + c + 16));
    }
    for (; c < lim; c += 16) vmax0 = _mm512_max_ps(vmax0, x_at(row, c, lim));
    return _mm512_max_ps(vmax0, vmax1);
  };
  // A: the first maximum (scaled) of the rows that have no reference maximum yet (m = −inf: no
  // allowed key so far), 16 rows at a time: the maximum of each row's first kReferenceKeys keys,
  // their lanes reduced together (RowMaxima), or of all its keys in the tile where those are all
  // masked; groups whose every row has one skip it. A NaN score may or may not come through
  // vmaxps (it returns its second operand when either is NaN); pass C finds it in the sums
  // (below).
  const __m512 vscale = _mm512_set1_ps(scale);
  for (size_t r0 = 0; r0 < rows; r0 += 16) {
    bool fresh = false;
    for (size_t r = r0; r < std::min(rows, r0 + 16); ++r) fresh |= m[r] == ninf;
    if (!fresh) {  // not read (pass B keeps m), but defined
      _mm512_store_ps(tile_max + r0, vninf);
      continue;
    }
    __m512 lanes[16];
    for (size_t k = 0; k < 16; ++k)
      lanes[k] = r0 + k < rows
                     ? row_max(s + (r0 + k) * lds, std::min(limit(r0 + k), kReferenceKeys))
                     : vninf;
    _mm512_store_ps(tile_max + r0, _mm512_mul_ps(RowMaxima(lanes), vscale));
    for (size_t r = r0; r < std::min(rows, r0 + 16); ++r)
      if (m[r] == ninf && tile_max[r] == ninf && limit(r) > kReferenceKeys)
        tile_max[r] = _mm512_reduce_max_ps(row_max(s + r * lds, limit(r))) * scale;
  }
  // B: 16 rows at a time, the reference maxima: a row that has one keeps it, α = 1 (P may then
  // exceed 1: pass C bounds it); a row without takes the tile's (α = 1: its O and l are still
  // 0). A NaN m stays NaN, and so α.
  for (size_t r = 0; r < rows; r += 16) {
    const __mmask16 valid =
        rows - r >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (rows - r)) - 1);
    const __m512 mo = _mm512_mask_loadu_ps(vninf, valid, m + r);
    const __mmask16 fresh = _mm512_cmp_ps_mask(mo, vninf, _CMP_EQ_OQ);
    const __m512 mn = _mm512_mask_mov_ps(mo, fresh, _mm512_load_ps(tile_max + r));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(mo, mo, _CMP_UNORD_Q);
    const __m512 al = _mm512_mask_blend_ps(is_nan, _mm512_set1_ps(1.0f), _mm512_set1_ps(qnan));
    _mm512_mask_storeu_ps(m + r, valid, mn);
    _mm512_mask_storeu_ps(alpha + r, valid, al);
    _mm512_store_ps(m_new + r, mn);
  }
  // C: P = 2^(s·scale·log2 e − m'·log2 e), its running sum per lane, and P rounded to bf16; four
  // vectors per step, so that four exponentials' dependency chains overlap.
  const __m512 vc = _mm512_set1_ps(scale * kLog2e);
  const __m512 bound = _mm512_set1_ps(kLazyBound);
  const __m512 l2e = _mm512_set1_ps(kLog2e);
  auto nan_row = [&](size_t r) HEADLIGHT_BF16_TARGET {  // a NaN score: m, α and l all NaN
    m[r] = alpha[r] = qnan;
    _mm512_storeu_ps(l + r * 16, _mm512_set1_ps(qnan));
    if (lr) _mm512_storeu_ps(lr + r * 16, _mm512_set1_ps(qnan));
  };
  for (size_t r = 0; r < rows; ++r) {
    const float* row = s + r * lds;
    float mn = m_new[r];
    auto* out = reinterpret_cast<char*>(pb + r * ldpb);
    float* row_l = l + r * 16;
    const size_t lim = limit(r);
    if (mn == ninf) {  // no allowed key yet: P = 0, and the sums stay (α = 1)
      for (size_t c = 0; c < cols; c += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * c), _mm256_setzero_si256());
      // ... unless a NaN score hid behind the −inf ones in pass A's maximum (a rare row: read
      // again whole).
      __mmask16 nan = 0;
      for (size_t c = 0; c < lim; c += 16) {
        const __m512 x = x_at(row, c, lim);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      }
      if (nan) nan_row(r);
      continue;
    }
    // The row's P against the reference mn, written to `out`; returns the sums per lane.
    auto pass = [&](float mref) HEADLIGHT_BF16_TARGET {
      const __m512 vml = _mm512_set1_ps(mref * kLog2e);
      auto p_full = [&](size_t c) HEADLIGHT_BF16_TARGET {  // a vector before the limit
        return Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(row + c), vc, vml));
      };
      auto p_at = [&](size_t c) HEADLIGHT_BF16_TARGET {  // 0 past the limit (2^−inf), not computed
        if (c >= lim) return _mm512_setzero_ps();
        return Exp2(_mm512_fmsub_ps(x_at(row, c, lim), vc, vml));
      };
      // Two running sums: each 32 keys' pair of vectors added, then into the sum of its half of
      // each 64 (amx::qk_exp_tile adds its blocks of 32 keys in the same order).
      __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;
      size_t c = 0;
      auto step64 = [&](size_t c, auto p) HEADLIGHT_BF16_TARGET {
        const __m512 p0 = p(c), p1 = p(c + 16), p2 = p(c + 32), p3 = p(c + 48);
        sum0 = _mm512_add_ps(sum0, _mm512_add_ps(p0, p1));
        sum1 = _mm512_add_ps(sum1, _mm512_add_ps(p2, p3));
        _mm512_storeu_si512(out + 2 * c, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
        _mm512_storeu_si512(out + 2 * c + 64, (__m512i)_mm512_cvtne2ps_pbh(p3, p2));
      };
      for (; c + 64 <= lim; c += 64) step64(c, p_full);  // wholly before the limit
      for (; c + 64 <= cols; c += 64) step64(c, p_at);
      for (; c + 32 <= cols; c += 32) {
        const __m512 p0 = p_at(c), p1 = p_at(c + 16);
        sum0 = _mm512_add_ps(sum0, _mm512_add_ps(p0, p1));
        _mm512_storeu_si512(out + 2 * c, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
      }
      if (c < cols) {
        const __m512 p0 = p_at(c);
        sum1 = _mm512_add_ps(sum1, p0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * c),
                            (__m256i)_mm512_cvtneps_pbh(p0));
      }
      return _mm512_add_ps(sum0, sum1);
    };
    __m512 sum = pass(mn);
    // A NaN score makes its P NaN, and so the sums (as does an infinite score: ∞ − ∞). The row
    // is then NaN, as when pass A's maximum is: m, α and every lane of l (O follows through α).
    if (_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q)) {
      nan_row(r);
      continue;
    }
    // A score far above the reference (some lane's sum past kLazyBound; while none is, no P is
    // either): the row again against its true maximum, α rescaling what came before.
    if (_mm512_cmp_ps_mask(sum, bound, _CMP_GT_OQ)) {
      const float mt = _mm512_reduce_max_ps(row_max(row, lim)) * scale;
      const float mo = mn;
      mn = std::max(mo, mt);
      const __m512 al = Exp2(_mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(mo), l2e),
                                           _mm512_mul_ps(_mm512_set1_ps(mn), l2e)));
      m[r] = mn;
      alpha[r] = _mm512_cvtss_f32(al);
      sum = pass(mn);
      if (_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q)) {
        nan_row(r);
        continue;
      }
    }
    _mm512_storeu_ps(row_l, _mm512_fmadd_ps(_mm512_set1_ps(alpha[r]), _mm512_loadu_ps(row_l), sum));
  }
  if (!lr) return;
  // D: the sums of P as rounded, from the rows just written (AddRoundedSums), rows independent of
  // each other. A pass of its own: inside C the sums' latency at the end of every row had cost
  // the GPT engine's shape (128 keys) a tenth. Rows without a key yet wrote zeros (α = 1: the
  // sums stay); a NaN row's α is NaN.
  for (size_t r = 0; r < rows; ++r) AddRoundedSums(pb + r * ldpb, cols, alpha[r], lr + r * 16);
}

HEADLIGHT_BF16_TARGET bool commit_tile_sums(const float* sums, const float* m_new, size_t rows,
                                            float* m, float* l, float* alpha, const bf16* pb,
                                            size_t ldpb, size_t cols, float* lr) {
  const __m512 bound = _mm512_set1_ps(kLazyBound);
  for (size_t r = 0; r < rows; ++r) {
    const __m512 sum = _mm512_loadu_ps(sums + r * 16);
    // NaN (unordered) or past the bound: the row's softmax_rows path (nan_row or the recompute)
    if (_mm512_cmp_ps_mask(sum, bound, _CMP_NLE_UQ)) return false;
  }
  for (size_t r = 0; r < rows; ++r) {
    _mm512_storeu_ps(l + r * 16,
                     _mm512_add_ps(_mm512_loadu_ps(l + r * 16), _mm512_loadu_ps(sums + r * 16)));
    m[r] = m_new[r];
    alpha[r] = 1.0f;
  }
  // softmax_rows's pass D (α = 1)
  if (lr)
    for (size_t r = 0; r < rows; ++r) AddRoundedSums(pb + r * ldpb, cols, 1.0f, lr + r * 16);
  return true;
}

// Per 128-bit block: the block sums of four vectors, from the interleaved pair sums x (of the
// first two) and y (of the last two).
HEADLIGHT_BF16_TARGET inline __m512 BlockSums(__m512 x, __m512 y) {
  const __m512d dx = _mm512_castps_pd(x), dy = _mm512_castps_pd(y);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(dx, dy)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(dx, dy)));
}

// Lane i of the result: the sum of a[i]'s 16 lanes, i < 8. Two levels of in-lane interleaves
// (per 128-bit block, then the block sums of four vectors side by side), then the four blocks
// added by block shuffles: 17 instructions for 8 sums.
HEADLIGHT_BF16_TARGET inline __m256 SumEight(const __m512* a) {
  __m512 t[4];  // per block: a[2i] and a[2i + 1] interleaved, lanes 0 + 2 and 1 + 3 added
  HEADLIGHT_UNROLL
  for (size_t i = 0; i < 4; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  const __m512 u0 = BlockSums(t[0], t[1]), u1 = BlockSums(t[2], t[3]);  // a[0..4), a[4..8)
  // Blocks [u0₀ + u0₂, u0₁ + u0₃, u1₀ + u1₂, u1₁ + u1₃], then each pair of blocks added.
  const __m512 w =
      _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x44), _mm512_shuffle_f32x4(u0, u1, 0xEE));
  const __m512 z = _mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, 0xB1));
  return _mm512_castps512_ps256(_mm512_shuffle_f32x4(z, z, 0x88));
}

HEADLIGHT_BF16_TARGET void lane_sums(const float* l, size_t rows, float* out) {
  size_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    __m512 a[8];
    HEADLIGHT_UNROLL
    for (size_t i = 0; i < 8; ++i) a[i] = _mm512_loadu_ps(l + (r + i) * 16);
    _mm256_storeu_ps(out + r, SumEight(a));
  }
  if (r == rows) return;
  __m512 a[8];  // the last rows beside zero ones: each row's sum is formed the same way
  for (size_t i = 0; i < 8; ++i)
    a[i] = r + i < rows ? _mm512_loadu_ps(l + (r + i) * 16) : _mm512_setzero_ps();
  alignas(32) float sums[8];
  _mm256_store_ps(sums, SumEight(a));
  std::copy_n(sums, rows - r, out + r);
}

// R query rows (≤ 4) against cols key rows, NV vectors of 16 pair words per row: the rows stay in
// registers and each key row is loaded once for all of them; 8 / R keys a step (R = 3 as 4), one
// accumulator per (row, key), summed by SumEight into the step's 8 scores. With `ahead`, every
// line of the key rows kDecodeAhead keys on and of each key's value row is prefetched into L2.
template <size_t R, size_t NV>
HEADLIGHT_BF16_TARGET inline void DecodeScoresRows(const uint32_t* q, size_t ldq, const uint32_t* k,
                                                   size_t ldk, size_t cols, float scale, float* s,
                                                   size_t lds, const DecodeAhead& ahead) {
  constexpr size_t kRows = R == 3 ? 4 : R, kKeys = 8 / kRows;
  __m512bh qv[R][NV];
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
  for (size_t v = 0; v < NV; ++v) qv[r][v] = (__m512bh)_mm512_loadu_si512(q + r * ldq + v * 16);
  const __m256 vs = _mm256_set1_ps(scale);
  for (size_t c = 0; c < cols; c += kKeys) {
    const size_t n = std::min(kKeys, cols - c);  // a short last step repeats its last key
    const uint32_t* key[kKeys];
    HEADLIGHT_UNROLL
    for (size_t j = 0; j < kKeys; ++j) key[j] = k + (c + std::min(j, n - 1)) * ldk;
    if (ahead.v)
      for (size_t j = 0; j < n; ++j) {
        const auto* kn = reinterpret_cast<const char*>(key[j] + kDecodeAhead * ldk);
        const auto* vr = reinterpret_cast<const char*>(ahead.v + (c + j) * ahead.ldv);
        for (size_t x = 0; x < NV * 64; x += 64) _mm_prefetch(kn + x, _MM_HINT_T1);
        for (size_t x = 0; x < ahead.width * sizeof(bf16); x += 64)
          _mm_prefetch(vr + x, _MM_HINT_T1);
      }
    __m512 acc[8];  // acc[kKeys · row + key]
    HEADLIGHT_UNROLL
    for (size_t i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
    HEADLIGHT_UNROLL
    for (size_t j = 0; j < kKeys; ++j) HEADLIGHT_UNROLL
    for (size_t v = 0; v < NV; ++v) {  // each key row front to back, one after the other
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(key[j] + v * 16);
      HEADLIGHT_UNROLL
      for (size_t r = 0; r < R; ++r)
        acc[kKeys * r + j] = _mm512_dpbf16_ps(acc[kKeys * r + j], qv[r][v], kv);
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, _mm256_mul_ps(SumEight(acc), vs));
    if (n == kKeys) {  // a constant size: one move per row
      HEADLIGHT_UNROLL
      for (size_t r = 0; r < R; ++r)
        std::memcpy(s + r * lds + c, sums + kKeys * r, kKeys * sizeof(float));
    } else
      for (size_t r = 0; r < R; ++r)
        for (size_t j = 0; j < n; ++j) s[r * lds + c + j] = sums[kKeys * r + j];
  }
}

template <size_t NV>
HEADLIGHT_BF16_TARGET inline void DecodeScoresBlock(const uint32_t* q, size_t ldq, size_t rows,
                                                    const uint32_t* k, size_t ldk, size_t cols,
                                                    float scale, float* s, size_t lds,
                                                    const DecodeAhead& ahead) {
  switch (rows) {
    case 1:
      return DecodeScoresRows<1, NV>(q, ldq, k, ldk, cols, scale, s, lds, ahead);
    case 2:
      return DecodeScoresRows<2, NV>(q, ldq, k, ldk, cols, scale, s, lds, ahead);
    case 3:
      return DecodeScoresRows<3, NV>(q, ldq, k, ldk, cols, scale, s, lds, ahead);
    default:
      return DecodeScoresRows<4, NV>(q, ldq, k, ldk, cols, scale, s, lds, ahead);
  }
}

// Runs of kRun keys, each run by blocks of query rows: the first block reads the run's key rows
// from memory, the later ones from L1. A block is 4 rows up to D = 64 and 2 above: a block of 3 or
// 4 rows at D = 128 (12 or 16 query registers) ran 20–30% slower with the keys on 2 MiB pages
// (Tensors from 4 MiB, numpy's large arrays) than on 4 KB ones: 32 heads over 8, 4,096 keys, one
// thread, 1.24–1.33 ms against 0.96–1.06; in blocks of 2 rows 0.82–0.83 on 2 MiB pages and
// 0.99–1.06 on 4 KB ones (docs/notes/2026-12-07-huge-pages-and-decode-rows.md).
template <size_t NV>
HEADLIGHT_BF16_TARGET inline void DecodeScoresRuns(const uint32_t* q, size_t ldq, size_t rows,
                                                   const uint32_t* k, size_t ldk, size_t cols,
                                                   float scale, float* s, size_t lds,
                                                   const DecodeAhead& ahead) {
  constexpr size_t kRun = 32;  // keys (8 KB at D = 128)
  constexpr size_t kBlock = NV <= 2 ? 4 : 2;
  for (size_t c0 = 0; c0 < cols; c0 += kRun) {
    const size_t n = std::min(kRun, cols - c0);
    for (size_t r0 = 0; r0 < rows; r0 += kBlock) {
      // The first block of rows reads the keys from memory: it prefetches.
      DecodeAhead run_ahead{};
      if (r0 == 0 && ahead.v) run_ahead = {ahead.v + c0 * ahead.ldv, ahead.ldv, ahead.width};
      DecodeScoresBlock<NV>(q + r0 * ldq, ldq, std::min(kBlock, rows - r0), k + c0 * ldk, ldk, n,
                            scale, s + r0 * lds + c0, lds, run_ahead);
    }
  }
}

HEADLIGHT_BF16_TARGET void decode_scores_bf16(const uint32_t* q, size_t ldq, size_t rows,
                                              const uint32_t* k, size_t ldk, size_t pairs,
                                              size_t cols, float scale, float* s, size_t lds,
                                              const DecodeAhead& ahead) {
  switch (pairs / 16) {
    case 1:
      return DecodeScoresRuns<1>(q, ldq, rows, k, ldk, cols, scale, s, lds, ahead);
    case 2:
      return DecodeScoresRuns<2>(q, ldq, rows, k, ldk, cols, scale, s, lds, ahead);
    case 3:
      return DecodeScoresRuns<3>(q, ldq, rows, k, ldk, cols, scale, s, lds, ahead);
    default:
      return DecodeScoresRuns<4>(q, ldq, rows, k, ldk, cols, scale, s, lds, ahead);
  }
}

// P·V for decode from bf16 value rows read where they lie. vdpbf16ps pairs two keys: the rows
// v[c] and v[c + 1] are interleaved in registers (vpunpcklwd/vpunpckhwd within 128-bit blocks)
// into pair words, and each probability pair (the rounded P rows read as words) is broadcast. The
// interleave permutes each group of 32 outputs (per block: 4 from the low words, 4 from the high):
// the accumulators hold them permuted, so o is permuted on load and put back on store
// (kLoadLo/Hi, kStoreLo/Hi). An odd last key is paired with zeros (its word's other half is a
// padded column, P = 0).
constexpr int kLoadLo[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
constexpr int kLoadHi[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
constexpr int kStoreLo[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
constexpr int kStoreHi[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

template <size_t R, size_t NV>
HEADLIGHT_BF16_TARGET inline void DecodePvRows(const uint32_t* p, size_t ldp, size_t cols,
                                               const bf16* v, size_t ldv, float* o, size_t ldo,
                                               const float* alpha) {
  const __m512i load_lo = _mm512_loadu_si512(kLoadLo), load_hi = _mm512_loadu_si512(kLoadHi);
  __m512 acc[R][2 * NV];  // per 32 outputs: the low words' 16, then the high words'
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) {
    const __m512 al = _mm512_set1_ps(alpha ? alpha[r] : 1.0f);
    HEADLIGHT_UNROLL
    for (size_t m = 0; m < NV; ++m) {
      const __m512 n0 = _mm512_loadu_ps(o + r * ldo + 32 * m);
      const __m512 n1 = _mm512_loadu_ps(o + r * ldo + 32 * m + 16);
      acc[r][2 * m] = _mm512_mul_ps(al, _mm512_permutex2var_ps(n0, load_lo, n1));
      acc[r][2 * m + 1] = _mm512_mul_ps(al, _mm512_permutex2var_ps(n0, load_hi, n1));
    }
  }
  auto step = [&](size_t c, const bf16* v1) HEADLIGHT_BF16_TARGET {  // keys c, c + 1 (v1 null: 0)
    const bf16* v0 = v + c * ldv;
    __m512bh pw[R];
    HEADLIGHT_UNROLL
    for (size_t r = 0; r < R; ++r)
      pw[r] = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[r * ldp + c / 2]));
    HEADLIGHT_UNROLL
    for (size_t m = 0; m < NV; ++m) {
      const __m512i a = _mm512_loadu_si512(v0 + 32 * m);
      const __m512i b = v1 ? _mm512_loadu_si512(v1 + 32 * m) : _mm512_setzero_si512();
      const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b);
      const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
      HEADLIGHT_UNROLL
      for (size_t r = 0; r < R; ++r) {
        acc[r][2 * m] = _mm512_dpbf16_ps(acc[r][2 * m], pw[r], lo);
        acc[r][2 * m + 1] = _mm512_dpbf16_ps(acc[r][2 * m + 1], pw[r], hi);
      }
    }
  };
  size_t c = 0;
  for (; c + 2 <= cols; c += 2) step(c, v + (c + 1) * ldv);
  if (c < cols) step(c, nullptr);
  const __m512i store_lo = _mm512_loadu_si512(kStoreLo), store_hi = _mm512_loadu_si512(kStoreHi);
  HEADLIGHT_UNROLL
  for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
  for (size_t m = 0; m < NV; ++m) {
    _mm512_storeu_ps(o + r * ldo + 32 * m,
                     _mm512_permutex2var_ps(acc[r][2 * m], store_lo, acc[r][2 * m + 1]));
    _mm512_storeu_ps(o + r * ldo + 32 * m + 16,
                     _mm512_permutex2var_ps(acc[r][2 * m], store_hi, acc[r][2 * m + 1]));
  }
}

// Blocks of R rows (at most 16 accumulators: 2 rows at D = 128, 4 at D = 64), then the rest.
template <size_t NV>
HEADLIGHT_BF16_TARGET inline void DecodePvWidth(const uint32_t* p, size_t ldp, size_t rows,
                                                size_t cols, const bf16* v, size_t ldv, float* o,
                                                size_t ldo, const float* alpha) {
  constexpr size_t kRows = NV <= 2 ? 4 : 2;
  auto at = [&](size_t r) { return alpha ? alpha + r : nullptr; };
  size_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    DecodePvRows<kRows, NV>(p + r * ldp, ldp, cols, v, ldv, o + r * ldo, ldo, at(r));
  switch (rows - r) {
    case 3:
      DecodePvRows<3, NV>(p + r * ldp, ldp, cols, v, ldv, o + r * ldo, ldo, at(r));
      break;
    case 2:
      DecodePvRows<2, NV>(p + r * ldp, ldp, cols, v, ldv, o + r * ldo, ldo, at(r));
      break;
    case 1:
      DecodePvRows<1, NV>(p + r * ldp, ldp, cols, v, ldv, o + r * ldo, ldo, at(r));
      break;
    default:
      break;
  }
}

HEADLIGHT_BF16_TARGET void decode_pv_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t cols,
                                          const bf16* v, size_t ldv, size_t width, float* o,
                                          size_t ldo, const float* alpha) {
  switch (width / 32) {
    case 1:
      return DecodePvWidth<1>(p, ldp, rows, cols, v, ldv, o, ldo, alpha);
    case 2:
      return DecodePvWidth<2>(p, ldp, rows, cols, v, ldv, o, ldo, alpha);
    case 3:
      return DecodePvWidth<3>(p, ldp, rows, cols, v, ldv, o, ldo, alpha);
    default:
      return DecodePvWidth<4>(p, ldp, rows, cols, v, ldv, o, ldo, alpha);
  }
}

HEADLIGHT_BF16_TARGET void scale_round_rows(const float* x, size_t ldx, size_t rows, size_t width,
                                            const float* scale, bf16* dst, size_t ldd) {
  const __m512i exponent = _mm512_set1_epi32(0x7F800000), mantissa = _mm512_set1_epi32(0x7FFFFF);
  auto denormals = [&](__m512 v) HEADLIGHT_BF16_TARGET {  // lanes with exponent 0, mantissa not
    const __m512i b = _mm512_castps_si512(v);
    return _mm512_mask_cmpeq_epi32_mask(_mm512_test_epi32_mask(b, mantissa),
                                        _mm512_and_si512(b, exponent), _mm512_setzero_si512());
  };
  for (size_t r = 0; r < rows; ++r) {
    const float* src = x + r * ldx;
    bf16* out = dst + r * ldd;
    const float f = scale[r];
    const __m512 vf = _mm512_set1_ps(f);
    size_t c = 0;
    for (; c + 32 <= width; c += 32) {
      const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(src + c), vf);
      const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(src + c + 16), vf);
      if ((denormals(a) | denormals(b)) != 0) {
        for (size_t i = c; i < c + 32; ++i) out[i] = to_bf16(src[i] * f);
        continue;
      }
      _mm512_storeu_si512(out + c, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
    for (; c < width; ++c) out[c] = to_bf16(src[c] * f);
  }
}

HEADLIGHT_BF16_TARGET void exp_shift_rows(float* s, size_t rows, size_t cols, size_t lds,
                                          const float* lse, const int32_t* row_cols) {
  const __m512 l2e = _mm512_set1_ps(kLog2e), vninf = _mm512_set1_ps(-__builtin_inff());
  for (size_t r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    if (!(lse[r] > -__builtin_inff())) {  // no allowed key (0), or a NaN row (NaN)
      const __m512 fill = _mm512_set1_ps(lse[r] != lse[r] ? lse[r] : 0.0f);
      for (size_t c = 0; c < cols; c += 16) _mm512_storeu_ps(row + c, fill);
      continue;
    }
    // Past the row's limit the scores are taken as −inf: P = 0, not computed.
    const size_t lim =
        row_cols ? std::min(cols, static_cast<size_t>(std::max(row_cols[r], 0))) : cols;
    const __m512 shift = _mm512_set1_ps(lse[r] * kLog2e);
    size_t c = 0;
    for (; c + 32 <= lim; c += 32) {  // two exponentials' chains side by side
      const __m512 p0 = Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(row + c), l2e, shift));
      const __m512 p1 = Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(row + c + 16), l2e, shift));
      _mm512_storeu_ps(row + c, p0);
      _mm512_storeu_ps(row + c + 16, p1);
    }
    for (; c < lim; c += 16) {
      const __m512 x =
          c + 16 <= lim
              ? _mm512_loadu_ps(row + c)
              : _mm512_mask_loadu_ps(vninf, static_cast<__mmask16>((1u << (lim - c)) - 1), row + c);
      _mm512_storeu_ps(row + c, Exp2(_mm512_fmsub_ps(x, l2e, shift)));
    }
    for (; c < cols; c += 16) _mm512_storeu_ps(row + c, _mm512_setzero_ps());
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
void softmax_rows(float*, size_t, size_t, size_t, float*, float*, float*, float, bf16*, size_t,
                  const int32_t*, float*) {
  fail("softmax_rows: no native bf16 path on this architecture");
}
void lane_sums(const float*, size_t, float*) {
  fail("lane_sums: no native bf16 path on this architecture");
}
void row_pairs(const float*, size_t, size_t, size_t, size_t, uint32_t*, size_t) {
  fail("row_pairs: no native bf16 path on this architecture");
}
bool commit_tile_sums(const float*, const float*, size_t, float*, float*, float*, const bf16*,
                      size_t, size_t, float*) {
  fail("commit_tile_sums: no native bf16 path on this architecture");
}
void scale_round_rows(const float*, size_t, size_t, size_t, const float*, bf16*, size_t) {
  fail("scale_round_rows: no native bf16 path on this architecture");
}
void exp_shift_rows(float*, size_t, size_t, size_t, const float*, const int32_t*) {
  fail("exp_shift_rows: no native bf16 path on this architecture");
}
void decode_scores_bf16(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t,
                        float, float*, size_t, const DecodeAhead&) {
  fail("decode_scores_bf16: no native bf16 path on this architecture");
}
void decode_pv_bf16(const uint32_t*, size_t, size_t, size_t, const bf16*, size_t, size_t, float*,
                    size_t, const float*) {
  fail("decode_pv_bf16: no native bf16 path on this architecture");
}
}  // namespace headlight::attention::cpu::kernels::native

#endif

// Decode from a blocked bf16 cache (attention/kv_layout.h) on AVX-512 BF16: the scores and P·V
// loops flash_forward.cc's decode calls when the plan reads a blocked cache in place
// (plan.blocked); every other path reads the cache through a row copy (with_row_cache).
//
// The layout: keys in groups of 16, [pairs][16 keys] of pair words, so one 64-byte line is one
// pair of 16 keys; values in chunks of 256 keys, [slabs of w][128 key pairs][w] pair words, one
// line 16 outputs of a key pair.
//
// Scores: s[r, c] = scale · Σ_p q[r, p] · k[c, p] over pair words. Per group of 16 keys and R ≤ 4
// rows: for each pair p, the group's line of pair p is loaded once and each row's pair word is
// broadcast against it (one vdpbf16ps: 16 keys × 2 products, the word broadcast from memory by
// the instruction itself, DotBroadcast), into 4 accumulators a row taken in turn (4 chains of
// pairs / 4 updates, far below the latency bound); the 4 are added and scaled, and the 16 lanes
// are the 16 keys' scores: no horizontal sums. 4 vdpbf16ps a line, the least at 4 rows, and the
// key lines read once, in address order.
//
// P·V: o[r, :] = α[r] · o[r, :] + Σ_c P[r, c] · v[c, :]. Per chunk and slab: R × w / 16
// accumulators (16 at 4 rows and w = 64) loaded from o, then for each key pair one line per 16
// outputs, each row's probability pair (one word of the rounded P) broadcast against it by the
// vdpbf16ps itself; stored back. No interleaving of value rows (the cache holds them paired) and
// no second pass over the values for more rows (4 rows fit the registers), so every value line is
// read once from memory, in address order, by 4 vdpbf16ps.
//
// The broadcasts folded into the vdpbf16ps leave about one instruction a line beside the 4
// products (5 a line where a separate vpbroadcastd per product had made 9 in the scores). With
// the cache in L3 decode's arithmetic took 7% less time (32 heads over 8, D = 128, 4,096 keys,
// Zen 4: 0.154–0.175 ms against 0.166–0.192); from memory, the fewer instructions let the
// out-of-order window reach further ahead of a line that misses
// (docs/notes/2026-12-06-decode-overlap.md).
//
// Where the CPU wants it (Plan::prefetch_rows: Intel's cores) the scores prefetch into L2 the key
// lines kDecodeAhead keys ahead and the start of the tile's values (a quarter of the keys' pace;
// the hardware prefetchers stream the rest): on Sapphire Rapids, 32 heads over 8, D = 128, 4,096
// keys, 1.10–1.15 ms against 0.95–1.03 with the prefetches.
//
// Keys past the tile (a last group's or pair's other lanes) may hold anything: their scores are
// replaced by −inf (the masks' padding), and the value half paired with no key is cleared before
// it is multiplied (its P is 0, but 0 · NaN is not).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "src/attention/cpu/flash_bf16.h"

#if defined(__x86_64__) || defined(_M_X64)
#include "src/attention/cpu/bf16_target.h"

namespace headlight::attention::cpu::kernels::native {
namespace {

template <size_t R>
HEADLIGHT_BF16_TARGET inline void BlockedScoresRows(const uint32_t* q, size_t ldq,
                                                    const uint32_t* groups_at, size_t pairs,
                                                    size_t groups, float scale, float* s,
                                                    size_t lds, const uint32_t* v_ahead,
                                                    size_t v_group_lines) {
  const __m512 vs = _mm512_set1_ps(scale);
  for (size_t gi = 0; gi < groups; ++gi) {
    const uint32_t* g = groups_at + gi * pairs * 16;
    if (v_ahead) {  // a group's lines kDecodeAhead keys on, and a quarter of its values' share
      const auto* kn = reinterpret_cast<const char*>(g + kDecodeAhead * pairs);
      const auto* vn = reinterpret_cast<const char*>(v_ahead) + gi * v_group_lines * 64;
      for (size_t x = 0; x < pairs * 64; x += 64) _mm_prefetch(kn + x, _MM_HINT_T1);
      for (size_t x = 0; x < v_group_lines * 64; x += 64) _mm_prefetch(vn + x, _MM_HINT_T1);
    }
    __m512 acc[R][4];
    HEADLIGHT_UNROLL
    for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
    for (size_t u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
    for (size_t p = 0; p < pairs; p += 4) {
      HEADLIGHT_UNROLL
      for (size_t u = 0; u < 4; ++u) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(g + (p + u) * 16);
        HEADLIGHT_UNROLL
        for (size_t r = 0; r < R; ++r) acc[r][u] = DotBroadcast(acc[r][u], kv, q + r * ldq + p + u);
      }
    }
    HEADLIGHT_UNROLL
    for (size_t r = 0; r < R; ++r) {
      const __m512 x =
          _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
      _mm512_storeu_ps(s + r * lds + gi * 16, _mm512_mul_ps(x, vs));
    }
  }
}

template <size_t R, size_t NS>
HEADLIGHT_BF16_TARGET inline void BlockedPvRows(const uint32_t* p, size_t ldp, size_t j0,
                                                size_t cols, const uint32_t* v, size_t slabs,
                                                float* o, size_t ldo) {
  constexpr size_t w = NS * 16;  // slab width, pair words
  const __m512i low_halves = _mm512_set1_epi32(0xFFFF);
  for (size_t c0 = j0; c0 < j0 + cols; c0 += 256) {
    const size_t keys = std::min<size_t>(256, j0 + cols - c0), pairs = (keys + 1) / 2;
    const uint32_t* pw = p + (c0 - j0) / 2;
    for (size_t sl = 0; sl < slabs; ++sl) {
      const uint32_t* vs = v + ((c0 / 256) * slabs + sl) * 128 * w;
      float* os = o + sl * w;
      __m512 acc[R][NS];
      HEADLIGHT_UNROLL
      for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
      for (size_t x = 0; x < NS; ++x) acc[r][x] = _mm512_loadu_ps(os + r * ldo + x * 16);
      auto step = [&](size_t c2, bool lone) HEADLIGHT_BF16_TARGET {  // lone: no key after 2·c2
        HEADLIGHT_UNROLL
        for (size_t x = 0; x < NS; ++x) {
          __m512i line = _mm512_loadu_si512(vs + c2 * w + x * 16);
          if (lone) line = _mm512_and_si512(line, low_halves);
          HEADLIGHT_UNROLL
          for (size_t r = 0; r < R; ++r)
            acc[r][x] = DotBroadcast(acc[r][x], (__m512bh)line, pw + r * ldp + c2);
        }
      };
      const size_t whole = keys / 2;
      for (size_t c2 = 0; c2 < whole; ++c2) step(c2, false);
      if (whole < pairs) step(whole, true);
      HEADLIGHT_UNROLL
      for (size_t r = 0; r < R; ++r) HEADLIGHT_UNROLL
      for (size_t x = 0; x < NS; ++x) _mm512_storeu_ps(os + r * ldo + x * 16, acc[r][x]);
    }
  }
}

template <size_t R>
struct ScoresBlock {
  HEADLIGHT_BF16_TARGET static void run(size_t r, const uint32_t* q, size_t ldq,
                                        const uint32_t* groups_at, size_t pairs, size_t groups,
                                        float scale, float* s, size_t lds, const uint32_t* v_ahead,
                                        size_t v_group_lines) {
    BlockedScoresRows<R>(q + r * ldq, ldq, groups_at, pairs, groups, scale, s + r * lds, lds,
                         r == 0 ? v_ahead : nullptr, v_group_lines);
  }
};

template <size_t NS>
struct PvBlock {
  template <size_t R>
  struct Rows {
    HEADLIGHT_BF16_TARGET static void run(size_t r, const uint32_t* p, size_t ldp, size_t j0,
                                          size_t cols, const uint32_t* v, size_t slabs, float* o,
                                          size_t ldo) {
      BlockedPvRows<R, NS>(p + r * ldp, ldp, j0, cols, v, slabs, o + r * ldo, ldo);
    }
  };
};

}  // namespace

HEADLIGHT_BF16_TARGET void blocked_scores_bf16(const uint32_t* q, size_t ldq, size_t rows,
                                               const uint32_t* k, size_t pairs, size_t j0,
                                               size_t cols, float scale, float* s, size_t lds,
                                               const uint32_t* v, size_t width) {
  // The tile's values from key j0 (a multiple of 256) on, contiguous over the tile's chunks: a
  // quarter of the keys' pace (width / 8 of a group's width / 2 lines), as amx::blocked_scores.
  const uint32_t* v_ahead = v ? v + j0 * width / 2 : nullptr;
  const size_t v_group_lines = width / 8;
  const uint32_t* groups_at = k + (j0 / 16) * pairs * 16;
  const size_t groups = (cols + 15) / 16;
  // Blocks of 4 rows; the later blocks read the tile's keys from L2.
  ForRowBlocks<4, ScoresBlock>(rows, q, ldq, groups_at, pairs, groups, scale, s, lds, v_ahead,
                               v_group_lines);
}

HEADLIGHT_BF16_TARGET void blocked_pv_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t j0,
                                           size_t cols, const uint32_t* v, size_t width, float* o,
                                           size_t ldo, const float* alpha) {
  if (alpha)
    for (size_t r = 0; r < rows; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      for (size_t x = 0; x < width; x += 16)
        _mm512_storeu_ps(o + r * ldo + x, _mm512_mul_ps(a, _mm512_loadu_ps(o + r * ldo + x)));
    }
  // Blocks of 4 rows; the later blocks read the tile's values from L2.
  if (width % 64 == 0)
    ForRowBlocks<4, PvBlock<4>::Rows>(rows, p, ldp, j0, cols, v, width / 64, o, ldo);
  else
    ForRowBlocks<4, PvBlock<2>::Rows>(rows, p, ldp, j0, cols, v, width / 32, o, ldo);
}

}  // namespace headlight::attention::cpu::kernels::native

#else  // not x86-64: no native path

#include "headlight/core/error.h"

namespace headlight::attention::cpu::kernels::native {
void blocked_scores_bf16(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t,
                         float, float*, size_t, const uint32_t*, size_t) {
  fail("blocked_scores_bf16: no native bf16 path on this architecture");
}
void blocked_pv_bf16(const uint32_t*, size_t, size_t, size_t, size_t, const uint32_t*, size_t,
                     float*, size_t, const float*) {
  fail("blocked_pv_bf16: no native bf16 path on this architecture");
}
}  // namespace headlight::attention::cpu::kernels::native

#endif

// The AMX bf16 tiles: the two products of a tile on the matrix unit (tdpbf16ps: a 16×16 fp32 tile
// += a 16×32 bf16 tile times a 32×16 one, in pairs; 8,192 multiply-adds per instruction, about
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
// Memory traffic and what it costs (`headlight bench amx`, Sapphire Rapids): a product takes 16.7
// cycles and hides a 2 × 2 block's four tile loads from L1 (two per four products from L2), but
// each tile store stalls the matrix unit, ≈ 15 cycles into L1 and 56 into L2, where a 128 × 256
// score tile (128 KiB) lives: the scores' stores are most of QK's time at D = 64 (8 products, 4
// stores a block). Products from L2 do not overlap vector work interleaved with them, so the
// forward runs a tile's products of scores, its softmax and its products of values as whole
// phases (flash_forward.cc; docs/notes/2026-12-06-amx-forward-rows.md). The exception is
// qk_exp_tile: a block's four score tiles stored into a 4 KiB buffer in L1 and exponentiated right
// away cost less than the same stores into the 128 KiB score tile (L2) and a softmax that reads
// them back: at D = 64, where a block of scores is 8 products and 4 stores, the scores and the
// softmax went from 3.6 to 3.1 ns a 16 scores (`bench/micro/forward_tiles`); at D = 128 (16
// products a block) from 4.4 to 4.1-4.4.
//
// Decode from a blocked cache (attention/kv_layout.h) reads its tiles straight from the cache: a
// key group, [pairs][16 keys] of pair words, is a B tile per 16 pairs as it lies (1 KB,
// contiguous), and a value chunk's slab, [128 key pairs][w words], is one per 16 key pairs and 16
// outputs (rows w words apart). The group's query rows (padded to 16) stay in tiles 2–5 while
// the key groups pass, two accumulators in turn; P·V is the product above with P's rows as A. A
// short last step of 32 keys copies its value pairs into scratch with zeros past the last key
// (the cache holds anything there). The tiles take the arithmetic off the critical path: on
// Sapphire Rapids vdpbf16ps issues every other cycle, so with 4 query rows a key/value head its
// loops took about as long as the memory; 32 heads over 8, D = 128, 4,096 keys: 0.97 → 0.81–0.84
// ms, and 4 query rows each (16 a group) 2.14 → 0.96. One row per key/value head uses a sixteenth
// of each tile and stays on vdpbf16ps (12 heads, D = 64: 0.29 against 0.32 ms). With the
// arithmetic gone, what remains is how many lines a core has in flight: the scores prefetch one
// line a 4 KB page of the keys ahead and of the tile's values (native::kPageBytes) and leave the
// rest of each page to the hardware prefetchers, 0.83–0.88 → 0.76–0.80 ms. Decode from rows as
// they lie (rows_scores, rows_pv below: no cache layout of its own) now reads about as fast: the
// same shape 0.80–0.83 ms against the blocked cache's 0.76–0.81 in the same rounds (on vdpbf16ps
// 0.93–0.97); 4 query rows a key/value head 2.1 → 1.0 ms.

#include <algorithm>
#include <cstring>

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "src/attention/cpu/flash_bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "src/attention/cpu/amx_block.h"
#include "src/attention/cpu/bf16_target.h"  // Exp2, kLog2e; -W(maybe-)uninitialized silenced

namespace headlight::attention::cpu::kernels::amx {
namespace {

using tiles::Block;

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

// o[r, :] ·= α[r] for r < rows (width a multiple of 16), before o is loaded into the accumulators.
HEADLIGHT_AMX_TARGET void ScaleRows(float* o, size_t ldo, size_t rows, size_t width,
                                    const float* alpha) {
  for (size_t r = 0; r < rows; ++r) {
    if (alpha[r] == 1.0f) continue;  // the row's maximum did not move (most rows, after a while)
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (size_t x = 0; x < width; x += 16)
      _mm512_storeu_ps(o + r * ldo + x, _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + x), a));
  }
}

// The exponentials of one 2 × 2 block's scores (rows r0 .. r0 + 16·RT of the tile, keys x .. x +
// 32), stored by the tiles into buf [32, 32]: P rounded to bf16 into p, and the block's two vectors
// of each row added, then into the row's running sum of the first or second half of each 64 keys
// (part [32 rows][2][16]), as native::softmax_rows adds them.
template <int RT>
HEADLIGHT_AMX_TARGET inline void ExpBlock(const float* buf, size_t r0, size_t x, __m512 vc,
                                          const float* mlog, bf16* p, size_t ldp, float* part) {
  const size_t half = x % 64 == 0 ? 0 : 16;
  for (size_t i = 0; i < 16 * RT; ++i) {
    const __m512 vml = _mm512_set1_ps(mlog[r0 + i]);
    const __m512 p0 = native::Exp2(_mm512_fmsub_ps(_mm512_load_ps(buf + i * 32), vc, vml));
    const __m512 p1 = native::Exp2(_mm512_fmsub_ps(_mm512_load_ps(buf + i * 32 + 16), vc, vml));
    float* sum = part + i * 32 + half;
    _mm512_store_ps(sum, _mm512_add_ps(_mm512_load_ps(sum), _mm512_add_ps(p0, p1)));
    _mm512_storeu_si512(p + (r0 + i) * ldp + x, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
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

HEADLIGHT_AMX_TARGET void qk_exp_tile(const uint32_t* q, size_t ldq, size_t rows,
                                      const uint32_t* kt, size_t ldk, size_t pairs, size_t cols,
                                      float scale, const float* m, float* m_new, bf16* p,
                                      size_t ldp, float* sums) {
  check(cols % 64 == 0 && rows <= kMaxQkExpRows,
        "amx::qk_exp_tile: cols must be a multiple of 64 and rows at most {}", kMaxQkExpRows);
  alignas(64) float buf[32 * 32];         // one block's scores: [32 rows, 32 keys], in L1
  alignas(64) float part[32 * 32];        // the running sums of 32 rows: [row][2][16]
  alignas(64) float mlog[kMaxQkExpRows];  // m · log2 e per row; 0 for the junk rows
  const size_t rows16 = (rows + 15) / 16 * 16;
  for (size_t r = 0; r < rows16; ++r) {
    if (r < rows) m_new[r] = m[r];
    mlog[r] = r < rows ? m[r] * native::kLog2e : 0.0f;
  }
  const size_t real_rows = rows;
  rows = rows16;
  const __m512 vc = _mm512_set1_ps(scale * native::kLog2e);
  const size_t ldq_bytes = ldq * sizeof(uint32_t), steps = pairs / 16;
  const auto* q_bytes = reinterpret_cast<const char*>(q);
  for (size_t r = 0; r < rows; r += 32) {
    const bool two_rows = r + 32 <= rows;
    std::fill(part, part + 32 * 32, 0.0f);
    for (size_t x = 0; x < cols; x += 32) {
      // A step is 16 pair words of each query row (64 bytes).
      if (two_rows)
        Block<2, 2, false>(q_bytes + r * ldq_bytes, ldq_bytes, kt + x, ldk, steps, 64, buf, 32);
      else
        Block<1, 2, false>(q_bytes + r * ldq_bytes, ldq_bytes, kt + x, ldk, steps, 64, buf, 32);
      static_assert(native::kReferenceKeys == 32, "a row's first maximum is its first block's");
      if (x == 0)  // rows without a reference maximum take their first block's (kReferenceKeys)
        for (size_t i = 0; i < (two_rows ? 32u : 16u) && r + i < real_rows; ++i)
          if (m[r + i] == -__builtin_inff()) {
            const float first = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_load_ps(buf + i * 32), _mm512_load_ps(buf + i * 32 + 16)));
            m_new[r + i] = first * scale;
            mlog[r + i] = m_new[r + i] * native::kLog2e;
          }
      if (two_rows)
        ExpBlock<2>(buf, r, x, vc, mlog, p, ldp, part);
      else
        ExpBlock<1>(buf, r, x, vc, mlog, p, ldp, part);
    }
    // Each row's sum as native::softmax_rows forms it: the two halves' sums added.
    for (size_t i = 0; i < (two_rows ? 32u : 16u); ++i)
      _mm512_storeu_ps(sums + (r + i) * 16, _mm512_add_ps(_mm512_load_ps(part + i * 32),
                                                          _mm512_load_ps(part + i * 32 + 16)));
  }
  _mm256_zeroupper();
}

HEADLIGHT_AMX_TARGET void pv_tile(const bf16* p, size_t ldp, size_t rows, size_t pairs,
                                  const uint32_t* v, size_t ldv, size_t width, float* o, size_t ldo,
                                  const float* alpha) {
  if (alpha) ScaleRows(o, ldo, rows, width, alpha);
  // The scaling left the upper halves of the vector registers dirty, and the product below (a
  // tail call the compiler would make) touches none, so nothing else would clear them: without
  // this the caller's SSE code (the per-row epilogue, libm's log) ran at a fraction of its speed.
  _mm256_zeroupper();
  // A step is 32 keys of each probability row (64 bytes).
  Product<true>(p, ldp * sizeof(bf16), rows, v, ldv, pairs / 16, 64, width, o, ldo);
}

namespace {

// The query tiles of one block of 16 rows, resident in tiles 2 .. 1 + S while the key groups pass:
// step e of 16 pair words is tile 2 + e (S ≤ 4: D ≤ 128).
template <size_t S>
HEADLIGHT_AMX_TARGET inline void LoadQueryTiles(const uint32_t* q, size_t ldq_bytes) {
  _tile_loadd(2, q, ldq_bytes);
  if constexpr (S > 1) _tile_loadd(3, q + 16, ldq_bytes);
  if constexpr (S > 2) _tile_loadd(4, q + 32, ldq_bytes);
  if constexpr (S > 3) _tile_loadd(5, q + 48, ldq_bytes);
}

// Accumulator tile C (0 or 1) = the resident queries · key group g ([pairs][16 keys] words: a B
// tile of 16 pair rows every 256 words), B tiles 6 and 7 in turn. (The tile intrinsics take their
// tile numbers as literals, hence the macro.)
#define HEADLIGHT_GROUP_SCORES(C, S, g) \
  do {                                  \
    _tile_zero(C);                      \
    _tile_loadd(6, (g), 64);            \
    _tile_dpbf16ps(C, 2, 6);            \
    if constexpr ((S) > 1) {            \
      _tile_loadd(7, (g) + 256, 64);    \
      _tile_dpbf16ps(C, 3, 7);          \
    }                                   \
    if constexpr ((S) > 2) {            \
      _tile_loadd(6, (g) + 512, 64);    \
      _tile_dpbf16ps(C, 4, 6);          \
    }                                   \
    if constexpr ((S) > 3) {            \
      _tile_loadd(7, (g) + 768, 64);    \
      _tile_dpbf16ps(C, 5, 7);          \
    }                                   \
  } while (false)

template <size_t S>
HEADLIGHT_AMX_TARGET void BlockedScores(const uint32_t* q, size_t ldq, size_t rows16,
                                        const uint32_t* groups_at, size_t groups, float* s,
                                        size_t lds, const char* v_ahead, size_t v_group_bytes) {
  const size_t group_words = S * 256, pairs = S * 16;
  for (size_t r = 0; r < rows16; r += 16) {
    LoadQueryTiles<S>(q + r * ldq, ldq * sizeof(uint32_t));
    float* sr = s + r * lds;
    for (size_t gi = 0; gi < groups; gi += 2) {
      const uint32_t* g = groups_at + gi * group_words;
      if (r == 0 && v_ahead) {  // a line a page: keys kDecodeAhead on, these groups' values
        const auto* kn = reinterpret_cast<const char*>(g + native::kDecodeAhead * pairs);
        for (size_t x = 0; x < 2 * pairs * 64; x += native::kPageBytes)
          _mm_prefetch(kn + x, _MM_HINT_T1);
        const char* vn = v_ahead + gi * v_group_bytes;
        for (size_t x = 0; x < 2 * v_group_bytes; x += native::kPageBytes)
          _mm_prefetch(vn + x, _MM_HINT_T1);
      }
      HEADLIGHT_GROUP_SCORES(0, S, g);
      _tile_stored(0, sr + gi * 16, lds * sizeof(float));
      if (gi + 1 < groups) {
        HEADLIGHT_GROUP_SCORES(1, S, g + group_words);
        _tile_stored(1, sr + gi * 16 + 16, lds * sizeof(float));
      }
    }
  }
}

}  // namespace

HEADLIGHT_AMX_TARGET void blocked_scores(const uint32_t* q, size_t ldq, size_t rows,
                                         const uint32_t* k, size_t pairs, size_t j0, size_t cols,
                                         float scale, float* s, size_t lds, const uint32_t* v,
                                         size_t width) {
  const uint32_t* groups_at = k + (j0 / 16) * pairs * 16;
  const size_t groups = (cols + 15) / 16, rows16 = (rows + 15) / 16 * 16;
  // The tile's values from key j0 (a multiple of 256) on, contiguous over the tile's chunks: a
  // group of 16 keys' share is 32 · width bytes.
  const char* v_ahead = v ? reinterpret_cast<const char*>(v + j0 * width / 2) : nullptr;
  constexpr decltype(&BlockedScores<1>) kSteps[] = {BlockedScores<1>, BlockedScores<2>,
                                                    BlockedScores<3>, BlockedScores<4>};
  check(pairs % 16 == 0 && pairs >= 16 && pairs <= 64,
        "amx::blocked_scores: pairs must be 16, 32, 48 or 64");
  kSteps[pairs / 16 - 1](q, ldq, rows16, groups_at, groups, s, lds, v_ahead, 32 * width);
  const __m512 vs = _mm512_set1_ps(scale);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < groups * 16; c += 16)
      _mm512_storeu_ps(s + r * lds + c, _mm512_mul_ps(_mm512_loadu_ps(s + r * lds + c), vs));
  _mm256_zeroupper();
}

HEADLIGHT_AMX_TARGET void blocked_pv(const bf16* p, size_t ldp, size_t rows, size_t j0, size_t cols,
                                     const uint32_t* v, size_t width, float* o, size_t ldo,
                                     const float* alpha, uint32_t* spare) {
  if (alpha) ScaleRows(o, ldo, rows, width, alpha);
  const size_t rows16 = (rows + 15) / 16 * 16, w = width % 64 == 0 ? 64 : 32, slabs = width / w;
  for (size_t c0 = j0; c0 < j0 + cols; c0 += 256) {
    const size_t keys = std::min<size_t>(256, j0 + cols - c0), whole = keys / 32, rest = keys % 32;
    const bf16* pc = p + (c0 - j0);
    for (size_t sl = 0; sl < slabs; ++sl) {
      const uint32_t* vs = v + ((c0 / 256) * slabs + sl) * 128 * w;
      float* os = o + sl * w;
      if (whole > 0) Product<true>(pc, ldp * sizeof(bf16), rows16, vs, w, whole, 64, w, os, ldo);
      if (rest == 0) continue;
      // The last 32 keys' step, short: its value pairs through `spare`, zero past the last key
      // (the cache's rows there may hold anything, and 0 · NaN is not 0).
      const uint32_t* last = vs + whole * 16 * w;
      const size_t full_pairs = rest / 2;
      std::memcpy(spare, last, full_pairs * w * sizeof(uint32_t));
      for (size_t x = 0; x < w; ++x)
        spare[full_pairs * w + x] = rest % 2 ? last[full_pairs * w + x] & 0xFFFFu : 0u;
      std::memset(spare + (full_pairs + 1) * w, 0, (15 - full_pairs) * w * sizeof(uint32_t));
      Product<true>(pc + whole * 32, ldp * sizeof(bf16), rows16, spare, w, 1, 64, w, os, ldo);
    }
  }
  _mm256_zeroupper();
}

namespace {

// Decode from bf16 rows where they lie (a row-layout cache, no packing).
//
// Scores as Sᵀ = K · Qᵀ: a key row's 32 elements are 16 pair words, which is an A tile's row as it
// lies (16 keys, rows ldk words apart), and Qᵀ is the B tile [16 pairs][16 query rows] of pair
// words, built once for a block of 16 query rows and resident in tiles 4 .. 3 + S while the keys
// pass (S ≤ 4 steps: D ≤ 128). Each group of 16 keys is 16 columns of S, stored transposed (a
// gather per query row) while the next group's products run: the scores of 32 heads over 8, D =
// 128, 4,096 keys took 27 ns a key on each thread without that overlap, 23 with it (19–21 with no
// transposition at all).
//
// P·V with the value rows as they lie as B tiles: a B tile's row k is then key k's 32 elements
// (pair words of adjacent elements), and tdpbf16ps adds A[m, 2k] · V[k, 2n] + A[m, 2k + 1] ·
// V[k, 2n + 1] into C[m, n]. With A's word k = (P[m, k], 0) the product is Σ_k P[m, k] V[k, 2n]
// (the even outputs), with (0, P[m, k]) the odd ones: two products a group of 16 keys and 32
// outputs, half of each product's multiplications by zero, and no interleave of the value rows.
// The accumulators hold each 32 outputs as [16 even | 16 odd] (rows_pv); rows_order puts them
// back. A chunk of 128 keys runs its even outputs, then its odd ones, each pass over every group
// of 32 outputs (up to 4 accumulators), so that the first pass reads each value row whole from
// memory and the second from L1; a pass per 64 outputs (both parities, half of each row a pass)
// had been about 5% slower over the whole call. The arithmetic is far below the memory's pace: at D
// = 128 a key costs 4 products of scores and 8 of P·V; what sets the pace is how the tile loads
// stream from memory, as in the blocked loops above. Prefetching: as blocked_scores (a line a
// page of the keys kDecodeAhead on and of their values); every line of every row only for rows
// apart (a position-major cache), as the vdpbf16ps loops do. A software prefetch of every line
// of contiguous rows was slower (the core's line fill buffers), and prefetching the values a
// chunk or more ahead inside rows_pv made no difference once each pass read whole rows.

// Accumulator C = 16 key rows (kp, ld_bytes apart) · the resident Qᵀ, S steps of 16 pairs; A
// tiles 2 and 3 in turn. (The tile intrinsics take their tile numbers as literals.)
#define HEADLIGHT_ROWS_SCORES(C, S, kp, ld_bytes) \
  do {                                            \
    _tile_zero(C);                                \
    _tile_loadd(2, (kp), (ld_bytes));             \
    _tile_dpbf16ps(C, 2, 4);                      \
    if constexpr ((S) > 1) {                      \
      _tile_loadd(3, (kp) + 16, (ld_bytes));      \
      _tile_dpbf16ps(C, 3, 5);                    \
    }                                             \
    if constexpr ((S) > 2) {                      \
      _tile_loadd(2, (kp) + 32, (ld_bytes));      \
      _tile_dpbf16ps(C, 2, 6);                    \
    }                                             \
    if constexpr ((S) > 3) {                      \
      _tile_loadd(3, (kp) + 48, (ld_bytes));      \
      _tile_dpbf16ps(C, 3, 7);                    \
    }                                             \
  } while (false)

// s[r, i] = scale · buf[i, r] for r < rows, i < 16: column r of one group's Sᵀ [16 keys, 16 rows].
HEADLIGHT_AMX_TARGET inline void StoreTransposed(const float* buf, size_t rows, __m512 vs, float* s,
                                                 size_t lds) {
  const __m512i column =
      _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
  for (size_t r = 0; r < rows; ++r)
    _mm512_storeu_ps(
        s + r * lds,
        _mm512_mul_ps(
            vs, _mm512_i32gather_ps(
                    _mm512_add_epi32(column, _mm512_set1_epi32(static_cast<int>(r))), buf, 4)));
}

// Prefetches into L2 for rows_scores: one line a page of the 16 key rows at kp and of their value
// rows (the rows contiguous: the hardware prefetchers take the rest of each page), or every line
// of each row (rows apart, which they follow poorly).
HEADLIGHT_AMX_TARGET inline void PrefetchRows(const char* rows, size_t ld_bytes, size_t row_bytes,
                                              bool every_line) {
  if (every_line) {
    for (size_t i = 0; i < 16; ++i)
      for (size_t x = 0; x < row_bytes; x += 64) _mm_prefetch(rows + i * ld_bytes + x, _MM_HINT_T1);
    return;
  }
  for (size_t x = 0; x < 16 * ld_bytes; x += native::kPageBytes)
    _mm_prefetch(rows + x, _MM_HINT_T1);
}

template <size_t S>
HEADLIGHT_AMX_TARGET void RowsScores(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* k,
                                     size_t ldk, size_t cols, float scale, float* s, size_t lds,
                                     const native::DecodeAhead& ahead, bool every_line) {
  constexpr size_t pairs = S * 16;
  alignas(64) uint32_t qt[pairs * 16];    // Qᵀ: [pairs][16 query rows]
  alignas(64) float buf[2][16 * 16];      // two groups' Sᵀ: [16 keys][16 query rows]
  alignas(64) uint32_t tail[16 * pairs];  // a last group's keys, zero past cols
  const size_t ldk_bytes = ldk * sizeof(uint32_t), key_bytes = pairs * sizeof(uint32_t);
  const __m512 vs = _mm512_set1_ps(scale);
  const auto* v_bytes = reinterpret_cast<const char*>(ahead.v);
  const size_t ldv_bytes = ahead.ldv * sizeof(bf16), v_row_bytes = ahead.width * sizeof(bf16);
  for (size_t r0 = 0; r0 < rows; r0 += 16) {
    const size_t n = std::min<size_t>(16, rows - r0);
    for (size_t e = 0; e < pairs; ++e)
      for (size_t r = 0; r < 16; ++r) qt[e * 16 + r] = r < n ? q[(r0 + r) * ldq + e] : 0u;
    _tile_loadd(4, qt, 64);
    if constexpr (S > 1) _tile_loadd(5, qt + 256, 64);
    if constexpr (S > 2) _tile_loadd(6, qt + 512, 64);
    if constexpr (S > 3) _tile_loadd(7, qt + 768, 64);
    // Group c's tile (16 key rows at kp, ld bytes apart): the last keys copied with zeros past
    // them (the rows past cols may hold anything); the first block of rows reads the keys from
    // memory and prefetches.
    auto group = [&](size_t c, size_t& ld) HEADLIGHT_AMX_TARGET -> const uint32_t* {
      const uint32_t* kp = k + c * ldk;
      ld = ldk_bytes;
      if (c + 16 > cols) {
        const size_t m = cols - c;
        for (size_t i = 0; i < m; ++i) std::memcpy(tail + i * pairs, kp + i * ldk, key_bytes);
        std::memset(tail + m * pairs, 0, (16 - m) * key_bytes);
        ld = key_bytes;
        return tail;
      }
      if (r0 == 0 && v_bytes) {
        if (c + native::kDecodeAhead + 16 <= cols)
          PrefetchRows(reinterpret_cast<const char*>(kp + native::kDecodeAhead * ldk), ldk_bytes,
                       key_bytes, every_line);
        PrefetchRows(v_bytes + c * ldv_bytes, ldv_bytes, v_row_bytes, every_line);
      }
      return kp;
    };
    // Two groups a step in accumulators 0 and 1: each group's scores are stored and transposed
    // while the other's products run.
    float* sr = s + r0 * lds;
    for (size_t c = 0; c < cols; c += 32) {
      size_t ld0 = 0, ld1 = 0;
      const uint32_t* k0 = group(c, ld0);
      HEADLIGHT_ROWS_SCORES(0, S, k0, ld0);
      if (c > 0) {
        _tile_stored(1, buf[1], 64);
        StoreTransposed(buf[1], n, vs, sr + c - 16, lds);
      }
      if (c + 16 < cols) {
        const uint32_t* k1 = group(c + 16, ld1);
        HEADLIGHT_ROWS_SCORES(1, S, k1, ld1);
      }
      _tile_stored(0, buf[0], 64);
      StoreTransposed(buf[0], n, vs, sr + c, lds);
    }
    const size_t last = (cols + 15) / 16 * 16 - 16;  // the last group's first key
    if (last % 32 == 16) {
      _tile_stored(1, buf[1], 64);
      StoreTransposed(buf[1], n, vs, sr + last, lds);
    }
  }
}

#undef HEADLIGHT_ROWS_SCORES

}  // namespace

HEADLIGHT_AMX_TARGET void rows_scores(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* k,
                                      size_t ldk, size_t pairs, size_t cols, float scale, float* s,
                                      size_t lds, const native::DecodeAhead& ahead,
                                      bool every_line) {
  constexpr decltype(&RowsScores<1>) kSteps[] = {RowsScores<1>, RowsScores<2>, RowsScores<3>,
                                                 RowsScores<4>};
  check(pairs % 16 == 0 && pairs >= 16 && pairs <= 64,
        "amx::rows_scores: pairs must be 16, 32, 48 or 64");
  kSteps[pairs / 16 - 1](q, ldq, rows, k, ldk, cols, scale, s, lds, ahead, every_line);
  _mm256_zeroupper();
}

HEADLIGHT_AMX_TARGET void rows_pv(const bf16* p, size_t ldp, size_t rows, size_t cols,
                                  const bf16* v, size_t ldv, size_t width, float* o, size_t ldo,
                                  const float* alpha) {
  check(width % 32 == 0 && width >= 32 && width <= 128,
        "amx::rows_pv: width must be 32, 64, 96 or 128");
  if (alpha) ScaleRows(o, ldo, rows, width, alpha);
  constexpr size_t kChunk = 128;                     // keys whose P words are formed at once
  alignas(64) uint32_t pw[kChunk / 16][2][16 * 16];  // per group of 16 keys: A tiles even, odd
  alignas(64) bf16 tail[16 * 128];                   // a last group's value rows, zero past cols
  const size_t ldv_bytes = ldv * sizeof(bf16), ldo_bytes = ldo * sizeof(float);
  for (size_t r0 = 0; r0 < rows; r0 += 16) {
    const size_t n = std::min<size_t>(16, rows - r0);
    float* orow = o + r0 * ldo;
    for (size_t g = 0; g < kChunk / 16; ++g)  // the rows past `rows`: zero
      for (size_t r = n; r < 16; ++r) {
        _mm512_store_si512(pw[g][0] + r * 16, _mm512_setzero_si512());
        _mm512_store_si512(pw[g][1] + r * 16, _mm512_setzero_si512());
      }
    for (size_t c0 = 0; c0 < cols; c0 += kChunk) {
      const size_t keys = std::min(kChunk, cols - c0), groups = (keys + 15) / 16;
      for (size_t g = 0; g < groups; ++g) {  // A's words: (P, 0) and (0, P), zero past cols
        const size_t m = std::min<size_t>(16, keys - g * 16);
        const auto mask = static_cast<__mmask16>((1u << m) - 1);
        for (size_t r = 0; r < n; ++r) {
          const __m512i w = _mm512_cvtepu16_epi32(
              _mm256_maskz_loadu_epi16(mask, p + (r0 + r) * ldp + c0 + g * 16));
          _mm512_store_si512(pw[g][0] + r * 16, w);
          _mm512_store_si512(pw[g][1] + r * 16, _mm512_slli_epi32(w, 16));
        }
      }
      const bf16* vc = v + c0 * ldv;
      const size_t whole = keys / 16;  // groups of 16 keys; a short last one goes through tail
      if (whole < groups) {
        const size_t m = keys - whole * 16;
        for (size_t i = 0; i < m; ++i)
          std::memcpy(tail + i * width, vc + (whole * 16 + i) * ldv, width * sizeof(bf16));
        std::fill(tail + m * width, tail + 16 * width, bf16{});
      }
      // Even outputs, then odd: each pass reads the chunk's value rows whole (the first from
      // memory, the second from L1), up to 4 groups of 32 outputs in accumulators 0-3.
      const size_t ng = width / 32;
      for (size_t parity = 0; parity < 2; ++parity) {
        float* oc = orow + 16 * parity;
        _tile_loadd(0, oc, ldo_bytes);
        if (ng > 1) _tile_loadd(1, oc + 32, ldo_bytes);
        if (ng > 2) _tile_loadd(2, oc + 64, ldo_bytes);
        if (ng > 3) _tile_loadd(3, oc + 96, ldo_bytes);
        for (size_t g = 0; g < groups; ++g) {
          const bf16* vg = g < whole ? vc + g * 16 * ldv : tail;
          const size_t ld = g < whole ? ldv_bytes : width * sizeof(bf16);
          _tile_loadd(4, pw[g][parity], 64);
          _tile_loadd(6, vg, ld);
          _tile_dpbf16ps(0, 4, 6);
          if (ng > 1) {
            _tile_loadd(7, vg + 32, ld);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (ng > 2) {
            _tile_loadd(6, vg + 64, ld);
            _tile_dpbf16ps(2, 4, 6);
          }
          if (ng > 3) {
            _tile_loadd(7, vg + 96, ld);
            _tile_dpbf16ps(3, 4, 7);
          }
        }
        _tile_stored(0, oc, ldo_bytes);
        if (ng > 1) _tile_stored(1, oc + 32, ldo_bytes);
        if (ng > 2) _tile_stored(2, oc + 64, ldo_bytes);
        if (ng > 3) _tile_stored(3, oc + 96, ldo_bytes);
      }
    }
  }
  _mm256_zeroupper();
}

HEADLIGHT_AMX_TARGET void rows_order(float* o, size_t ldo, size_t rows, size_t width) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (size_t r = 0; r < rows; ++r)
    for (size_t x = 0; x < width; x += 32) {
      float* at = o + r * ldo + x;
      const __m512 even = _mm512_loadu_ps(at), odd = _mm512_loadu_ps(at + 16);
      _mm512_storeu_ps(at, _mm512_permutex2var_ps(even, lo, odd));
      _mm512_storeu_ps(at + 16, _mm512_permutex2var_ps(even, hi, odd));
    }
  _mm256_zeroupper();
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
void qk_exp_tile(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float,
                 const float*, float*, bf16*, size_t, float*) {
  fail("amx::qk_exp_tile: no AMX on this architecture");
}
void product(const bf16*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float*, size_t,
             bool) {
  fail("amx::product: no AMX on this architecture");
}
void blocked_scores(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float,
                    float*, size_t, const uint32_t*, size_t) {
  fail("amx::blocked_scores: no AMX on this architecture");
}
void blocked_pv(const bf16*, size_t, size_t, size_t, size_t, const uint32_t*, size_t, float*,
                size_t, const float*, uint32_t*) {
  fail("amx::blocked_pv: no AMX on this architecture");
}
void rows_scores(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float,
                 float*, size_t, const native::DecodeAhead&, bool) {
  fail("amx::rows_scores: no AMX on this architecture");
}
void rows_pv(const bf16*, size_t, size_t, size_t, const bf16*, size_t, size_t, float*, size_t,
             const float*) {
  fail("amx::rows_pv: no AMX on this architecture");
}
void rows_order(float*, size_t, size_t, size_t) {
  fail("amx::rows_order: no AMX on this architecture");
}

}  // namespace headlight::attention::cpu::kernels::amx

#endif

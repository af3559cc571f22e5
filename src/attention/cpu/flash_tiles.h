// Tiles of the fused attention kernels, shared by the forward (flash_forward.cc) and the backward
// (flash_backward.cc): block sizes, the structural key range of a row, per-call plans and
// per-thread scratch, the scores of one tile with every option applied, and the packing of keys,
// values and queries. No SIMD here: the inner loops are in flash_kernels.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "headlight/attention/params.h"
#include "headlight/core/bf16.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention::cpu {

// Br: query rows per item and head (≤ kMaxSoftmaxRows). 48 by default; 144 for long queries
// (≥ kLongRows) without a causal or window mask: each K/V tile, streamed from L2/L3 once per
// item, then serves 3× the rows (with a causal mask the larger diagonal tiles and fewer items cost
// more than that saves; docs/notes/2026-12-03-forward-tiles.md).
constexpr int64_t kBlockRows = 48;
constexpr int64_t kBlockRowsLong = 144;
constexpr int64_t kLongRows = 1024;
// AMX: from this many keys up, 256 query rows per item, so that each key tile read from memory
// serves more rows (K and V no longer fit in the caches; the causal diagonal waste is negligible).
constexpr int64_t kLongKeys = 16384;
// ... or from this many bytes of one key/value head's K and V up (long_kv_amx), half the L2 of a
// Sapphire Rapids core: each 64-row item had streamed them from L3, and the tile loads waited on
// it. N = 8192, one head: D = 128 24.1–24.8 → 19.8–20.0 ms, causal 13.4–13.6 → 10.7–10.9; D = 64
// 15.5–16.6 → 13.9–14.5 (docs/notes/2026-12-06-amx-forward-rows.md).
constexpr int64_t kLongKvBytes = int64_t{1} << 20;
// The same for bf16 without AMX: 240 rows (whole 6-row register blocks of the vdpbf16ps tiles).
// On Zen 4, causal at 262,144 tokens: 311 GFLOP/s with 48 rows, 342 with 144, 351 with 240; no
// change at 16,384 and 32,768 (docs/notes/2026-12-05-bf16-without-amx.md).
constexpr int64_t kLongKeyRowsNative = 240;
// Bc: keys per tile. 256 rather than 128: fewer tiles per row halve the per-tile costs (the
// softmax's rescale pass, loading and storing the output accumulators in PvTile).
constexpr int64_t kBlockKeys = 256;
// Up to this many key blocks, and with at least this many (batch, key/value head) pairs per
// thread, a forward item is a whole pair that packs its keys into its own scratch (L2) instead of
// a shared buffer every item reads from L3: at the GPT engine's shape (B 16, H 4, N 128, D 32) the
// forward took 8–14% less time in bf16 and 6% in fp32.
constexpr int64_t kLocalPackBlocks = 2;
constexpr int64_t kLocalPackItemsPerThread = 4;
// (Or as many pairs for every thread: each takes whole pairs, all of a shape's pairs the same
// work. H = 2 on 2 threads, N = 2048, D = 64: 1.53 → 1.44 ms; H = 4, D = 128 4.67 → 4.38.)
// ... or with the pair's packed blocks within this many bytes (a Sapphire Rapids core's L2): a
// pair's items then read them from their own core's L2 rather than from a shared buffer written
// to L3 and read back. AMX, 8 pairs on 2 threads, ms: N = 2048, D = 128 9.7 → 8.7, causal
// 6.2 → 5.5; D = 64 6.5 → 6.2; N = 1024, D = 128 2.75 → 2.37; N = 4096, D = 128 (2 MiB a pair)
// 36.2 → 35.3; fp32 N = 2048, D = 64 27.9 → 26.7 (docs/notes/2026-12-06-lazy-softmax-maximum.md).
constexpr int64_t kLocalPackBytes = int64_t{2} << 20;
// Decode: at most this many query rows, split into pieces of at least this many key blocks
// (decode_split_blocks).
constexpr int64_t kDecodeRows = 16;
constexpr int64_t kDecodeSplitBlocks = 2;
// Longer pieces read faster when the memory is fast: where an item starts, its key and value
// streams start anew for the hardware prefetchers. Zen 4, 2 threads, bf16, alternating rounds with
// the probe at 54–58 GB/s: 32 heads over 8, D = 128, 4,096 keys: 0.606–0.653 ms with 2 blocks a
// piece, 0.575–0.600 with 4, 0.540–0.565 with 8 (the same 0.62–0.68 for all three with the probe at
// 32–36 GB/s); 9 heads over 3, D = 64, 8,192 keys: 0.262, 0.236, 0.212. Pieces stay short enough
// for kDecodeItems items where the keys allow it, so that several threads still share a call.
constexpr int64_t kDecodeSplitBlocksMost = 8;
constexpr int64_t kDecodeItems = 16;
// With at least this many (batch, key/value head) pairs per thread, a decode item is a whole pair:
// its pieces one after the other, then their merge (run_decode).
constexpr int64_t kDecodePairsPerThread = 4;
// Decode on vdpbf16ps (plan.native_decode) reads its keys and values in tiles of up to this many
// keys (plan.tile_keys), as long as the group's scores of a tile stay within
// kDecodeScoresBytes: the scores and P·V each stream longer (256 KB at D = 128) before the other
// takes over. Zen 4, 2 threads, 32 heads over 8, D = 128, 4,096 keys, 8 alternating rounds with
// the probe at 33–35 GB/s: 0.623–0.695 ms with tiles of 256 keys, 0.584–0.658 with 512,
// 0.587–0.635 with 1,024; 16 and 64 rows a group no slower; 128 rows (32 heads over 2, 8 query
// rows) 1.95 against 1.89 ms with 1,024, hence the bound on the scores.
constexpr int64_t kDecodeTileKeys = 1024;
constexpr int64_t kDecodeScoresBytes = 64 << 10;
// A bf16 decode reads its keys and values where they lie (widening each element as it loads it)
// for one query row, or up to this many rows per key/value head (query rows × group); more rows
// share the packing of the keys into pair words and the vdpbf16ps tiles, which then cost less.
// Zen 4, 2 threads, 32 heads over 8, D = 128, 4,096 keys: 2.1 ms in place against 2.8 packed
// for 4 query rows (16 per group), 3.6 against 3.4 for 8 (32), 7.2 against 5.2 for 16 (64); one
// row over 32 heads sharing one key/value head (32 per group): 0.54 against 0.70.
constexpr int64_t kInPlaceBf16Rows = 32;
// The same for a cache of at most kDecodeSplitBlocks blocks, whose alternative is the ordinary
// tiles with each item packing its keys into L2 (cheaper than decode's shared packing): 12 heads,
// D = 64, 256 keys: 4 rows 0.07 ms in place against 0.09, 8 rows 0.087 against 0.089, 16 rows
// 0.15 against 0.11; 2 rows over 32/8 heads (8 per group), D = 128, 512 keys: 0.22 against 0.26.
constexpr int64_t kInPlaceBf16RowsShort = 8;
// The same when decode runs on vdpbf16ps without AMX (decode_native_more_rows), whose in-place
// loops stay ahead of the packed vdpbf16ps tiles to more rows. Zen 4, 2 threads, D = 128, 4,096
// keys: 64 rows per key/value head (32 heads over 8, 16 query rows) 3.7 ms in place against 4.9
// packed, 128 rows (32 over 2, 8 query rows) 1.74 against 1.87, 256 rows 3.34 against 3.24; 512
// keys: 16 rows 0.19 against 0.30 ms, 32 rows 0.30 against 0.36, 64 rows 0.53 against 0.52.
constexpr int64_t kInPlaceNativeRows = 128;
constexpr int64_t kInPlaceNativeRowsShort = 32;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// The keys row i may attend to, from the structural masks: [lo, hi] inclusive (empty if lo > hi).
struct KeyRange {
  int64_t lo, hi;
};

// Sizes of one call's tiles, and the per-thread scratch carved from them (in floats).
//
// bf16 inputs (plan.bf16): a block holds Kᵀ as pair words [pairs, kt_words] then V as pair words
// [bc_pad / 2, v_words] (flash_bf16.h; a word is one float's size, so the counts below stay in
// floats), V is always packed, the queries are packed as pair words [group, br, pairs], and the
// probabilities of a tile are rounded into pb [br, ldpb] bf16 for P·V.
struct Plan {
  int64_t lanes, group, dv_pad, bc_pad, br;
  // Tiles' key columns are padded to a multiple of this: the float lanes, and for bf16 at least
  // 2 (P' and V hold whole pairs of keys; a one-lane target would otherwise drop an odd last key).
  int64_t key_step;
  bool bf16 = false;
  // bf16 decode read in place (decode_in_place, which is_decode then holds): keys and values read
  // where they lie, by the vdpbf16ps loops (native_decode) or by the fp32 decode loops, each
  // element widened as it is loaded (half the bytes of fp32).
  bool in_place_bf16 = false;
  // in_place_bf16 on vdpbf16ps: decode_native_bf16, and two or more rows per key/value head or
  // a blocked cache.
  bool native_decode = false;
  // A blocked cache (attention/kv_layout.h) read in place: native_decode then holds.
  bool blocked = false;
  // native_decode on AMX tiles, with AMX available and two or more rows per key/value head: a
  // blocked cache by amx::blocked_scores and blocked_pv, rows where they lie by amx::rows_scores
  // and rows_pv. The group's rows are padded to whole tiles of 16 in q, s, pb and o.
  bool amx_decode = false;
  // Decode prefetches its key and value rows into L2 whatever their length
  // (decode_prefetches_rows: the CPU's hardware prefetchers alone stream them too slowly).
  bool prefetch_rows = false;
  bool amx = false;  // bf16 products on AMX tiles: br a multiple of 16, bc_pad of 32, pairs of 16
  // bf16 tiles whose softmax runs as native::softmax_rows (AVX-512 BF16; both engines).
  bool native_softmax = false;
  // The softmax keeps the sums of P as rounded to bf16 (Scratch::lr) beside l, and the output is
  // divided by them (l gives the log-sum-exp): bf16 tiles and decode, P rounded in the softmax.
  bool rounded_sums = false;
  int64_t pairs = 0;  // bf16: head-dim pairs, ⌈D / 2⌉ (AMX: padded to a multiple of 16)
  // bf16 packed blocks (not decode in place): the packed Kᵀ's and V's leading dims in words and
  // pb's in bf16 elements: bc_pad, dv_pad and bc_pad, a cache line more on AMX (make_plan).
  int64_t kt_words = 0, v_words = 0, ldpb = 0;
  int64_t kv_blocks;  // key blocks per (batch, kv head)
  // Keys per tile: a key block, or up to kDecodeTileKeys for decode on vdpbf16ps (native_decode).
  int64_t tile_keys = kBlockKeys;
  // Value rows whole vectors wide (Dv = dv_pad) are read where they lie; otherwise they are
  // packed, padded, after the keys.
  bool v_in_place;
  int64_t block_floats;  // one packed key block: Kᵀ [D, bc_pad], then V [bc_pad, dv_pad] if packed
  size_t q_floats, s_floats, o_floats, row_floats;
  size_t pb_floats = 0;  // bf16: the rounded probabilities of one head's tile
  size_t total() const {
    // q, s, o; m, alpha, ent; l and lr (lanes per row); best (int64) and argcol (int32); pb
    return q_floats + s_floats + o_floats + row_floats * (6 + 2 * static_cast<size_t>(lanes)) +
           pb_floats;
  }
};

struct Scratch {
  float* q;      // [group, br, D] scaled queries
  float* s;      // [group·br, bc_pad] scores, then probabilities (one head's rows, or all)
  float* o;      // [group, br, dv_pad] unnormalised outputs
  float* m;      // [group·br] running maxima
  float* l;      // [group·br, lanes] running sums, per lane
  float* lr;     // [group·br, lanes] running sums of P as rounded to bf16 (plan.rounded_sums)
  float* alpha;  // [group·br] rescale factors of the current tile
  // Statistics (when asked for):
  float* ent;       // [group·br] Σ p̃ (s − m), see softmax_rows
  int64_t* best;    // [group·br] the key of the running maximum
  int32_t* argcol;  // [br] the column of a new maximum in the current tile
  bf16* pb;         // bf16 inputs: [br, bc_pad] the tile's probabilities, rounded
};

// Whether decode from a bf16 cache read in place can run on vdpbf16ps
// (kernels::native::decode_scores_bf16 and decode_pv_bf16) rather than widen each element as it
// loads it: AVX-512 BF16, head dims D and Dv multiples of 32 up to 128, the keys' rows whole
// 32-bit words. Half the instructions of the widening loops (no widening, two products an
// instruction); on Zen 4, 32 heads over 8, D = 128, 4,096 keys, one query row: 0.60–0.68 ms
// against 0.75 (docs/notes/2026-12-05-decode-without-prefetch.md). Taken for two or more query
// rows per key/value head (plan.native_decode); with one, the widening loop was as fast or faster
// (12 heads, D = 64: 0.26 ms against 0.28, prefetching its short rows).
bool decode_native_bf16(const AttentionParams& p);
// Whether those loops also take more rows in place (kInPlaceNativeRows): on a CPU without AMX.
// With AMX, more rows than kInPlaceBf16Rows go to the AMX tiles packed, as before (the in-place
// loops were not measured against them).
bool decode_native_more_rows(const AttentionParams& p);

// Whether a call with few query rows reads its keys and values where they lie (decode's loops,
// no packing): value rows whole vectors wide, and in bf16 one query row or few rows per
// key/value head (kInPlaceBf16Rows, kInPlaceBf16RowsShort). plan.group, dv_pad, kv_blocks and
// bf16 must be set.
inline bool decode_in_place(const AttentionParams& p, const Plan& plan) {
  const AttentionShape& sh = p.shape;
  if (sh.len_q > kDecodeRows || sh.value_dim != plan.dv_pad) return false;
  if (!plan.bf16 || sh.len_q == 1) return true;
  const bool native = decode_native_more_rows(p), long_cache = plan.kv_blocks > kDecodeSplitBlocks;
  const int64_t most = native ? (long_cache ? kInPlaceNativeRows : kInPlaceNativeRowsShort)
                              : (long_cache ? kInPlaceBf16Rows : kInPlaceBf16RowsShort);
  return plan.group * sh.len_q <= most;
}

// Key blocks per decode item: from the shape alone (batch × key/value heads × key blocks), never
// the thread count, so that the splits, and with them the bits, are the same for any thread count.
inline int64_t decode_split_blocks(const AttentionParams& p, const Plan& plan) {
  const int64_t blocks = p.shape.batch * p.shape.kv_heads * plan.kv_blocks;
  return std::clamp(blocks / kDecodeItems, kDecodeSplitBlocks, kDecodeSplitBlocksMost);
}

// Whether a call runs as decode: few query rows against several key blocks, split over the keys;
// or against any number of keys when it reads them in place. Packing the keys of a short cache
// for each step had cost more than the step's arithmetic: one row over 32 heads (8 key/value
// heads, D = 128) and 512 keys took 0.21 ms in bf16 (0.38 fp32) packed and 0.13 (0.21) in place
// (Zen 4, 2 threads).
inline bool is_decode(const AttentionParams& p, const Plan& plan) {
  return p.shape.len_q <= kDecodeRows &&
         (plan.kv_blocks > kDecodeSplitBlocks || decode_in_place(p, plan));
}

// Where a tile sits: batch b, query head h, rows [i0, i0 + rows), keys [j0, j0 + cols).
struct TilePos {
  int64_t b, h, i0, rows, j0, cols;
  bool partial;  // some row's structural key range does not cover the whole tile
};

// The keys row i may attend to (structural masks only).
KeyRange key_range(const AttentionParams& p, int64_t b, int64_t i);
// The keys [begin, end) some row of [i0, i1) may attend to: the union of their ranges, which the
// first and the last row bound (the ranges are monotone), within [0, len_kv). Empty: begin ≥ end.
struct KeySpan {
  int64_t begin, end;
};
KeySpan rows_key_span(const AttentionParams& p, int64_t b, int64_t i0, int64_t i1);

// Carves one worker's scratch.
Scratch carve(float* base, const Plan& plan);

// The columns row 0 of tile t may need: row r needs at most min(cols, first + r), because the
// structural last key grows by at most one per row (causal, windows, key lengths); t.cols when
// the tile is not partial. The bf16 tiles of a diagonal skip, per block of kDiagonalRows rows,
// the columns none of the block's rows may attend to (their scores are −inf, their weights 0).
int64_t first_row_columns(const AttentionParams& p, const TilePos& t);
constexpr int64_t kDiagonalRows = 6;  // the vdpbf16ps register tiles' rows

// fn(r0, n, keys) for each block of rows [r0, r0 + n) of a tile of `rows` × `cols` whose row 0
// needs `first` columns: keys = the columns the block's rows may need (0 .. cols). One block of
// every row when the tile is not on a diagonal (first ≥ cols).
template <class Fn>
void for_diagonal_blocks(int64_t rows, int64_t cols, int64_t first, Fn&& fn) {
  const int64_t block = first < cols ? kDiagonalRows : rows;
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t n = std::min(block, rows - r0);
    fn(r0, n, std::clamp<int64_t>(first + r0 + n - 1, 0, cols));
  }
}

// Per-element part of the scores of one tile: ALiBi, the additive mask, and −inf where the
// boolean mask or (on partial tiles) the structural ranges forbid; padded columns become −inf.
void apply_element_masks(const AttentionParams& p, const TilePos& t, int64_t cols_pad, float* s,
                         int64_t lds);

// s[rows, bc_pad] = the final scores of the tile: scale·Q·Kᵀ, soft-cap, ALiBi and masks; −inf where
// not allowed and on the padding. kt is the packed, scaled Kᵀ of the block and q the query rows as
// they lie (leading dim ldq); or kt is null, the key rows are read in place and q must hold the
// scaled queries (pack_queries).
// With raw (bf16 only; scale_in_softmax must hold) the scores are left unscaled for the softmax
// to scale.
// With masks false the element masks are not applied (the caller's softmax takes the rows' limits
// instead: only structural masks, no padding to hide, see row_limits).
void score_tile(const AttentionParams& p, const Plan& plan, const float* q, int64_t ldq,
                const TilePos& t, const float* kt, float* s, bool raw = false, bool masks = true);

// Whether each row's keys are a band (causal or a window): diagonal tiles then waste part of a
// tile's work, so items take fewer rows.
inline bool banded(const AttentionOptions& o) {
  return o.causal || o.window_left >= 0 || o.window_right >= 0;
}

// The rows' key limits of a tile, for a softmax that reads row r only before column
// out[r] (native::softmax_rows's row_cols): when the tile is partial, its only masks are
// structural and no row's first allowed key lies inside it (then every row allows columns
// [0, out[r])). Returns false, writing nothing, when the masks are to be applied (interior tiles
// need them only for their padding).
bool row_limits(const AttentionParams& p, const TilePos& t, int32_t* out);

// Whether the softmax may scale the scores itself (SoftmaxExtras::scale): the AMX products (whose
// scaling would be a pass of its own), a positive scale, and no option that needs scaled scores
// before the softmax (soft-cap, ALiBi, an additive mask).
bool scale_in_softmax(const AttentionParams& p, const Plan& plan);

// Multiplies P by the dropout mask of the tile: 0 or 1/(1 − p) per element (params.h).
void apply_dropout(const AttentionParams& p, const TilePos& t, float* s, int64_t lds);

// Backward: D_i = dO_i · O_i for every query row [batch, heads, len_q], from the values as they
// are (float32 or bf16), summed in fp32: in order for the fp32 backward, in one running sum per
// vector lane (kernels::dot_rows) for the bf16 one (bf16 inputs) and wherever O or dO is bf16.
std::vector<float> output_dots(ThreadContext& ctx, const AttentionParams& p);

// Backward: dK, dV [batch, kv_heads, len_kv, ·] = the sum of the chunks' partials
// [chunks, batch, kv_heads, len_kv, D or Dv] (float32), added in chunk order and stored into p.dk
// and p.dv (float32, or rounded once to bf16).
void add_partials(ThreadContext& ctx, const AttentionParams& p, int64_t chunks,
                  const float* dk_part, const float* dv_part);

// Backward: P' and dP' of a tile with dropout (keep factors into pd: pd = P ⊙ keep, dp ← dp ⊙
// keep); returns the probabilities the value gradient uses: pd with dropout, else s (P itself).
const float* backward_dropout(const AttentionParams& p, const TilePos& t, const float* s, float* pd,
                              float* dp, int64_t cols_pad, int64_t lds);

// dst[e·ld + c] = scale · x.at(b, g, j0 + c)[e] for c < cols, e < width: rows j0 .. j0 + cols of
// an operand transposed into dst [width, ld], zero in the columns [cols, ld).
void pack_transposed(const Operand& x, int64_t b, int64_t g, int64_t j0, int64_t cols,
                     int64_t width, float scale, float* dst, int64_t ld);

// Packs key block `blk` of (b, g): scale·Kᵀ [D, bc_pad] and (unless plan.v_in_place) V [bc_pad,
// dv_pad], zero-padded, from
// any strides (the softmax scale rides on the keys, so queries are used where they lie).
void pack_block(const AttentionParams& p, const Plan& plan, int64_t b, int64_t g, int64_t blk,
                float* dst);

// Tile sizes and scratch for one call on p.
Plan make_plan(const AttentionParams& p);

// Packs every key/value block once (O(L_kv · (D + Dv)) memory, kept across calls in the shared
// arena) and returns the packed blocks, [batch, kv_heads, kv_blocks, block_floats].
const float* pack_keys(ThreadContext& ctx, const AttentionParams& p, const Plan& plan);
// The same into `packed` (packed_floats(p, plan) floats), for a caller that shares the arena
// with other data.
size_t packed_floats(const AttentionParams& p, const Plan& plan);
void pack_keys_into(ThreadContext& ctx, const AttentionParams& p, const Plan& plan, float* packed);

// Copies the scaled query rows [i0, i0 + rows) of head h into dst [rows, D].
void pack_queries(const AttentionParams& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  float* dst);

// bf16 packing of rows j0 .. j0 + cols of (b, g) of a bf16 operand `width` wide, zero-padded:
// pack_pairs_transposed: dst [pairs, ld] pair words, word (e, c) = (x[c, 2e], x[c, 2e + 1]) (Kᵀ);
// pack_row_pairs: dst [rows_pad / 2, ld] pair words, word (c2, e) = (x[2·c2, e], x[2·c2 + 1, e])
// (V, and K for the backward's dQ).
void pack_pairs_transposed(const Operand& x, int64_t b, int64_t g, int64_t j0, int64_t cols,
                           int64_t width, int64_t pairs, int64_t ld, uint32_t* dst);
void pack_row_pairs(const Operand& x, int64_t b, int64_t g, int64_t j0, int64_t cols, int64_t width,
                    int64_t rows_pad, int64_t ld, uint32_t* dst);

// AMX: whether the tiles may read the query rows [i0, i0 + rows) of every head of group g where
// they lie, as pair words [rows, pairs] (leading dim row_stride / 2 words): rows as whole tiles
// of 16 (no row past the item's is read), pairs with no padding (head dim a multiple of 32), and
// every row on a cache line. A tile row that straddles two lines costs two loads: a stand-in of
// 2 × 2 blocks read 16-byte-aligned operands 2.5× slower (docs/notes/2026-12-06-amx-operands.md).
bool amx_queries_in_place(const AttentionParams& p, const Plan& plan, int64_t b, int64_t g,
                          int64_t i0, int64_t rows);

// bf16: copies the query rows [i0, i0 + rows) of head h as pair words into dst [rows, pairs]
// (unscaled; the bf16 product applies the scale to its fp32 sums).
void pack_query_pairs(const AttentionParams& p, const Plan& plan, int64_t b, int64_t h, int64_t i0,
                      int64_t rows, uint32_t* dst);

// bf16: the probabilities of a tile (s [rows, bc_pad], fp32; or, s null, already rounded into w.pb
// by the softmax) rounded to bf16 and multiplied into o [rows, dv_pad] with the packed values v of
// the block: o = α ⊙ o + round(P) · V.
// first: first_row_columns of the tile (rows past a row block's last needed column are skipped).
// fresh (AMX only): o holds no running state yet (the item's first key block): o = round(P) · V,
// written without loading o, the bits of 0 · α + P · V (o zeroed first if an α is not finite).
void pv_tile_bf16(const Plan& plan, const Scratch& w, const float* s, int64_t rows, int64_t cols,
                  const float* v_block, float* o, const float* alpha, int64_t first, bool fresh);

}  // namespace headlight::attention::cpu

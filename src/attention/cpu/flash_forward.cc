// Fused attention forward on the CPU: tiling, partitioning and scratch. The SIMD inner loops are
// in flash_kernels-inl.h (dispatched by flash_kernels.cc), the shared tile helpers in
// flash_tiles.h; the formulas are those of params.h, and reference::forward is the specification
// this kernel is tested against.
//
// The math (FlashAttention, Dao et al. 2022, with the FlashAttention-2 loop order). For one query
// row i and key blocks J_1, J_2, …, keep a running maximum m, a running sum l and an unnormalised
// output o:
//     S_J = s(i, J)                       scores of the block (scale folded into Q when packing)
//     m'  = max(m, max S_J),  α = exp(m − m'),  P_J = exp(S_J − m')
//     l'  = α·l + Σ P_J,      o' = α·o + P_J · V_J
// and at the end out_i = o / l, lse_i = m + log l. Every score is computed once and never stored
// beyond its tile: memory is O(rows × block) per thread, not O(L_q × L_kv).
//
// Tiling. A work item is (batch b, key/value head g, block of Br query rows); it holds the Br rows
// of every query head h of g's group, so each key/value tile is packed once for the whole group
// (GQA/MQA read K and V once per group). Before the items run, every key block of Bc keys (256, or
// all the keys when there are fewer) is packed once as Kᵀ [D, Bc], zero-padded, from any input
// strides, into a buffer kept across calls; V is read where it lies when its rows are whole vectors
// wide and packed as [Bc, Dv] otherwise. Each item then visits its key blocks and, per head:
//     QkTile → soft-cap → per-element bias and masks → SoftmaxRows → (dropout) → PvTile,
// or on AMX, for a whole tile without masks, the scores and their exponentials in one pass
// (amx::qk_exp_tile: the same maxima, P and sums as SoftmaxRows) → PvTile.
// Causal, window and key-length masks are structural: each row i allows the key range
// [lo(i), hi(i)], both non-decreasing in i, so the item visits only the key blocks that meet the
// union of its rows' ranges (blocks entirely outside are skipped, not masked) and applies
// element masks only on blocks that are partly outside. Boolean/additive masks and ALiBi apply per
// element on every visited block.
//
// With few keys (≤ kLocalPackBlocks blocks, or a pair's packed blocks within kLocalPackBytes) and
// enough (batch, key/value head) pairs per thread (or as many for each), an item is instead a
// whole pair: it packs that pair's key blocks into its own scratch and runs every query block
// against them while they are in L2 (the shared packing is written to memory the items then read
// back from L3); the tiles and sums are the same, and so are the bits.
//
// Memory traffic per item: Q once, K and V once per item (Br·group rows reuse each tile), O once.
// With Br = 48 and D = 64 a key tile is reused 48·group times from L1/L2. On AMX the tiles read
// bf16 queries where they lie when their rows are whole tiles on cache lines (else packed: a tile
// row across two lines costs two loads), and O is not zeroed: the first key block's P·V writes it.
//
// Threads take items dynamically; each item is computed by one thread in a fixed order, so the
// output is bitwise the same for any thread count.

#include "headlight/attention/cpu/flash_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/tensor.h"
#include "src/attention/cpu/flash_bf16.h"
#include "src/attention/cpu/flash_kernels.h"
#include "src/attention/cpu/flash_tiles.h"

namespace headlight::attention::cpu {
namespace {

// Whether the caller asked for per-row statistics.
bool wants_stats(const AttentionParams& p) {
  return p.entropy != nullptr || p.argmax != nullptr || p.max_weight != nullptr;
}

// Whether the call's rows are divided by the sums of P as rounded (plan.rounded_sums): where the
// softmax rounds P, without statistics or dropout.
bool rounded_sums(const AttentionParams& p, const Plan& plan) {
  return plan.rounded_sums && !wants_stats(p) && p.options.dropout_p == 0;
}

// (b, g)'s key blocks in pack_keys's buffer.
const float* blocks_of(const AttentionParams& p, const Plan& plan, const float* packed, int64_t b,
                       int64_t g) {
  return packed + (b * p.shape.kv_heads + g) * plan.kv_blocks * plan.block_floats;
}

// Where an item's query rows lie: batch b, key/value head g, rows [i0, i0 + rows) of each head.
struct ItemRows {
  int64_t b, g, i0, rows;
};

// Decode's tiles with keys and values read where they lie (accumulate_item without packed key
// blocks, its queries copied to w.q and its running state reset): the rows of every head of the
// group form one tile, so each key and value row is read once for the whole group. Per tile:
// scores → soft-cap → masks → softmax → (dropout) → P·V, on vdpbf16ps (plan.native_decode) or
// widening each element as it is loaded.
void accumulate_in_place(const AttentionParams& p, const Plan& plan, const Scratch& w,
                         const ItemRows& it, const KeyRange& first, const KeyRange& last,
                         int64_t j_begin, int64_t j_end) {
  const AttentionShape& sh = p.shape;
  const AttentionOptions& o = p.options;
  const int64_t D = sh.head_dim, G = plan.group, b = it.b, g = it.g, rows = it.rows;
  const int64_t gr = G * rows;  // rows == plan.br here: the heads' rows are contiguous
  const bool native = plan.native_decode, stats = wants_stats(p);
  const auto dv = static_cast<size_t>(sh.value_dim);
  // Rows that are not contiguous (a position-major cache) are prefetched: 20% faster there; so
  // are all rows where the CPU's hardware prefetchers stream them too slowly (plan.prefetch_rows).
  const bool rows_apart = p.k.row_stride != D || p.v.row_stride != sh.value_dim;
  const bool prefetch = plan.prefetch_rows || rows_apart;
  // On vdpbf16ps without statistics or dropout, the native softmax writes P rounded to bf16 for
  // P·V itself; otherwise P is rounded after the portable softmax and the dropout.
  const bool native_softmax = native && !stats && o.dropout_p == 0;
  for (int64_t j0 = j_begin / kBlockKeys * kBlockKeys; j0 < j_end; j0 += plan.tile_keys) {
    const int64_t cols = std::min(plan.tile_keys, j_end - j0);
    const int64_t cols_pad = round_up(cols, plan.key_step);
    // Entirely allowed structurally for every row?  Rows' lo and hi are monotone, so the first
    // row has the smallest hi and the last row the largest lo.
    const bool partial = !(last.lo <= j0 && first.hi >= j0 + cols - 1);
    // The widening loops prefetch the tile's value rows into L2 for P·V when the rows are short,
    // or always where plan.prefetch_rows (kernels::RowsAhead; flash_dot-inl.h).
    if (plan.blocked)  // on AMX tiles, or vdpbf16ps for one row a key/value head
      (plan.amx_decode ? kernels::amx::blocked_scores : kernels::native::blocked_scores_bf16)(
          reinterpret_cast<const uint32_t*>(w.q), static_cast<size_t>(D / 2),
          static_cast<size_t>(gr), reinterpret_cast<const uint32_t*>(p.k.bf16_at(b, g, 0)),
          static_cast<size_t>(D / 2), static_cast<size_t>(j0), static_cast<size_t>(cols),
          effective_scale(p), w.s, static_cast<size_t>(plan.bc_pad),
          plan.prefetch_rows ? reinterpret_cast<const uint32_t*>(p.v.bf16_at(b, g, 0)) : nullptr,
          dv);
    else if (plan.amx_decode)  // rows where they lie, on AMX tiles (every line where apart)
      kernels::amx::rows_scores(
          reinterpret_cast<const uint32_t*>(w.q), static_cast<size_t>(D / 2),
          static_cast<size_t>(gr), reinterpret_cast<const uint32_t*>(p.k.bf16_at(b, g, j0)),
          static_cast<size_t>(p.k.row_stride / 2), static_cast<size_t>(D / 2),
          static_cast<size_t>(cols), effective_scale(p), w.s, static_cast<size_t>(plan.bc_pad),
          {p.v.bf16_at(b, g, j0), static_cast<size_t>(p.v.row_stride), dv}, rows_apart);
    else if (native)
      kernels::native::decode_scores_bf16(
          reinterpret_cast<const uint32_t*>(w.q), static_cast<size_t>(D / 2),
          static_cast<size_t>(gr), reinterpret_cast<const uint32_t*>(p.k.bf16_at(b, g, j0)),
          static_cast<size_t>(p.k.row_stride / 2), static_cast<size_t>(D / 2),
          static_cast<size_t>(cols), effective_scale(p), w.s, static_cast<size_t>(plan.bc_pad),
          prefetch ? kernels::native::DecodeAhead{p.v.bf16_at(b, g, j0),
                                                  static_cast<size_t>(p.v.row_stride), dv}
                   : kernels::native::DecodeAhead{});
    else if (plan.bf16)  // a bf16 cache, read in place (plan.in_place_bf16), widened
      kernels::dot_tile_bf16(
          w.q, D, gr, p.k.bf16_at(b, g, j0), p.k.row_stride, D, cols, w.s, plan.bc_pad,
          {p.v.bf16_at(b, g, j0), static_cast<size_t>(p.v.row_stride), dv, plan.prefetch_rows});
    else
      kernels::dot_tile(
          w.q, D, gr, p.k.at(b, g, j0), p.k.row_stride, D, cols, w.s, plan.bc_pad,
          {p.v.at(b, g, j0), static_cast<size_t>(p.v.row_stride), dv, plan.prefetch_rows});
    if (o.softcap > 0) kernels::softcap_tile(w.s, gr, cols_pad, plan.bc_pad, o.softcap);
    for (int64_t hg = 0; hg < G; ++hg)
      apply_element_masks(p, {b, g * G + hg, it.i0, rows, j0, cols, partial}, cols_pad,
                          w.s + hg * rows * plan.bc_pad, plan.bc_pad);
    if (native_softmax)
      kernels::native::softmax_rows(w.s, static_cast<size_t>(gr), static_cast<size_t>(cols_pad),
                                    static_cast<size_t>(plan.bc_pad), w.m, w.l, w.alpha, 1.0f, w.pb,
                                    static_cast<size_t>(plan.bc_pad), nullptr,
                                    rounded_sums(p, plan) ? w.lr : nullptr);
    else
      kernels::softmax_rows(w.s, gr, cols_pad, plan.bc_pad, w.m, w.l, w.alpha,
                            {.ent = stats ? w.ent : nullptr, .argmax = stats ? w.argcol : nullptr});
    if (stats)
      for (int64_t k = 0; k < gr; ++k)
        if (w.argcol[k] >= 0) w.best[k] = j0 + w.argcol[k];
    if (o.dropout_p > 0)
      for (int64_t hg = 0; hg < G; ++hg)
        apply_dropout(p, {b, g * G + hg, it.i0, rows, j0, cols, partial},
                      w.s + hg * rows * plan.bc_pad, plan.bc_pad);
    if (native) {  // P rounded to bf16 pair words, then P·V on vdpbf16ps
      if (!native_softmax)
        kernels::native::round_tile_bf16(w.s, static_cast<size_t>(plan.bc_pad),
                                         static_cast<size_t>(gr), static_cast<size_t>(cols_pad),
                                         w.pb, static_cast<size_t>(plan.bc_pad));
      if (plan.amx_decode && !plan.blocked)
        kernels::amx::rows_pv(w.pb, static_cast<size_t>(plan.bc_pad), static_cast<size_t>(gr),
                              static_cast<size_t>(cols), p.v.bf16_at(b, g, j0),
                              static_cast<size_t>(p.v.row_stride), dv, w.o,
                              static_cast<size_t>(plan.dv_pad), w.alpha);
      else if (plan.amx_decode) {
        // P as bf16 rows, zero up to the last 32-key step's end (its keys past cols).
        for (int64_t r = 0; r < gr; ++r)
          std::fill(w.pb + r * plan.bc_pad + cols_pad, w.pb + r * plan.bc_pad + round_up(cols, 32),
                    bf16{});
        kernels::amx::blocked_pv(
            w.pb, static_cast<size_t>(plan.bc_pad), static_cast<size_t>(gr),
            static_cast<size_t>(j0), static_cast<size_t>(cols),
            reinterpret_cast<const uint32_t*>(p.v.bf16_at(b, g, 0)), dv, w.o,
            static_cast<size_t>(plan.dv_pad), w.alpha,
            reinterpret_cast<uint32_t*>(reinterpret_cast<float*>(w.pb) + plan.pb_floats -
                                        kernels::amx::kBlockedSpareWords));
      } else if (plan.blocked)
        kernels::native::blocked_pv_bf16(
            reinterpret_cast<const uint32_t*>(w.pb), static_cast<size_t>(plan.bc_pad / 2),
            static_cast<size_t>(gr), static_cast<size_t>(j0), static_cast<size_t>(cols),
            reinterpret_cast<const uint32_t*>(p.v.bf16_at(b, g, 0)), dv, w.o,
            static_cast<size_t>(plan.dv_pad), w.alpha);
      else
        kernels::native::decode_pv_bf16(reinterpret_cast<const uint32_t*>(w.pb),
                                        static_cast<size_t>(plan.bc_pad / 2),
                                        static_cast<size_t>(gr), static_cast<size_t>(cols),
                                        p.v.bf16_at(b, g, j0), static_cast<size_t>(p.v.row_stride),
                                        dv, w.o, static_cast<size_t>(plan.dv_pad), w.alpha);
    } else if (plan.bf16)
      kernels::pv_tile_in_place(w.s, plan.bc_pad, gr, cols, p.v.bf16_at(b, g, j0), p.v.row_stride,
                                plan.dv_pad, w.o, plan.dv_pad, w.alpha);
    else
      kernels::pv_tile_in_place(w.s, plan.bc_pad, gr, cols, p.v.at(b, g, j0), p.v.row_stride,
                                plan.dv_pad, w.o, plan.dv_pad, w.alpha);
  }
  // amx::rows_pv's accumulators hold each 32 outputs as their even then their odd ones.
  if (plan.amx_decode && !plan.blocked)
    kernels::amx::rows_order(w.o, static_cast<size_t>(plan.dv_pad), static_cast<size_t>(gr), dv);
}

// Runs the tiles of one item over the key blocks that meet [key_lo, key_hi) and the rows'
// structural ranges, leaving the running state (o, m, per-lane l) in w. `blocks` holds (b, g)'s
// packed key blocks, or is null: keys and values read where they lie.
void accumulate_item(const AttentionParams& p, const Plan& plan, const Scratch& w,
                     const float* blocks, int64_t b, int64_t g, int64_t i0, int64_t rows,
                     int64_t key_lo, int64_t key_hi) {
  const AttentionShape& sh = p.shape;
  const AttentionOptions& o = p.options;
  const int64_t D = sh.head_dim, G = plan.group;

  // Queries are used where they lie against packed (scaled) keys; reading keys in place needs
  // scaled copies of the queries. Then reset the running state.
  // A bf16 cache read in place on vdpbf16ps (plan.native_decode) takes the queries as bf16 pair
  // words, copied as they are (the scale is applied to the sums), and P rounded to bf16 as the
  // packed tiles round it.
  const bool native = !blocks && plan.native_decode;
  if (!blocks) {
    check(rows == plan.br, "flash_forward: keys in place need whole query blocks");
    for (int64_t hg = 0; hg < G; ++hg) {
      if (native)
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(reinterpret_cast<uint32_t*>(w.q) + (hg * rows + r) * (D / 2),
                      p.q.bf16_at(b, g * G + hg, i0 + r), static_cast<size_t>(D) * sizeof(bf16));
      else
        pack_queries(p, b, g * G + hg, i0, rows, w.q + hg * plan.br * D);
    }
  }
  if (plan.amx || plan.amx_decode) amx_configure_tiles();  // this worker's tiles, this item
  auto* q_pairs = reinterpret_cast<uint32_t*>(w.q);        // bf16: [G, br, pairs] words
  // bf16: the softmax takes raw scores when nothing else needs them scaled (scale_after_softmax),
  // and writes P rounded to bf16 when nothing changes P after it (no dropout).
  const bool raw_scores = plan.bf16 && scale_in_softmax(p, plan);
  const bool round_in_softmax = plan.bf16 && o.dropout_p == 0;
  // bf16 queries are read as pair words where they lie when each row is whole words (an even
  // head dim, rows an even number of elements apart, word-aligned; vdpbf16ps needs no padding),
  // else packed per head. AMX tiles read them in place only as whole tiles on cache lines
  // (amx_queries_in_place), else packed. Together with the accumulators below, binaries
  // alternated, medians of 5, ms: N = 512, 8 heads, D = 64 0.368 → 0.347, D = 128 0.586 → 0.546,
  // causal D = 64 0.255 → 0.237; N = 2048, D = 64 5.21 → 4.96, D = 128 8.33 → 8.17; the queries'
  // share at N = 512 2–4% (docs/notes/2026-12-06-amx-operands.md).
  const bool q_words =
      plan.bf16 && blocks &&
      (plan.amx ? amx_queries_in_place(p, plan, b, g, i0, rows)
                : D % 2 == 0 && p.q.row_stride % 2 == 0 &&
                      reinterpret_cast<uintptr_t>(p.q.bf16) % alignof(uint32_t) == 0 &&
                      p.q.head_stride % 2 == 0 && p.q.batch_stride % 2 == 0);
  auto q_rows = [&](int64_t hg) -> std::pair<const uint32_t*, int64_t> {
    if (q_words)
      return {reinterpret_cast<const uint32_t*>(p.q.bf16_at(b, g * G + hg, i0)),
              p.q.row_stride / 2};
    return {q_pairs + hg * plan.br * plan.pairs, plan.pairs};
  };
  if (plan.bf16 && blocks && !q_words)
    for (int64_t hg = 0; hg < G; ++hg)
      pack_query_pairs(p, plan, b, g * G + hg, i0, rows, q_pairs + hg * plan.br * plan.pairs);
  // On AMX the accumulators are not zeroed: the first key block's P·V writes them
  // (pv_tile_bf16's `fresh`), and an item that visits no block zeroes them at the end.
  const bool o_lazy = plan.amx && blocks;
  if (!o_lazy) std::fill(w.o, w.o + G * plan.br * plan.dv_pad, 0.0f);
  std::fill(w.m, w.m + G * plan.br, kNegInf);
  std::fill(w.l, w.l + G * plan.br * plan.lanes, 0.0f);
  const bool rounded = rounded_sums(p, plan);
  if (rounded) std::fill(w.lr, w.lr + G * plan.br * plan.lanes, 0.0f);
  const bool stats = wants_stats(p);
  if (stats) {
    std::fill(w.ent, w.ent + G * plan.br, 0.0f);
    std::fill(w.best, w.best + G * plan.br, int64_t{-1});
  }

  // The union of the rows' key ranges: first and last row bound it (ranges are monotone).
  const KeyRange first = key_range(p, b, i0), last = key_range(p, b, i0 + rows - 1);
  const int64_t j_begin = std::max({first.lo, key_lo, int64_t{0}});
  const int64_t j_end = std::min({last.hi + 1, key_hi, sh.len_kv});
  if (!blocks) {
    accumulate_in_place(p, plan, w, {b, g, i0, rows}, first, last, j_begin, j_end);
    return;
  }
  bool fresh = o_lazy;  // o holds nothing yet (AMX): the next P·V writes it
  for (int64_t j0 = j_begin / kBlockKeys * kBlockKeys; j0 < j_end;
       j0 += kBlockKeys, fresh = false) {
    // Keys past the last row's range are not computed at all (the causal diagonal).
    const int64_t cols = std::min(kBlockKeys, j_end - j0);
    const float* kt = blocks + (j0 / kBlockKeys) * plan.block_floats;
    const bool v_packed = !plan.v_in_place;
    const float* v = v_packed ? kt + D * plan.bc_pad : plan.bf16 ? nullptr : p.v.at(b, g, j0);
    const int64_t ldv = v_packed ? plan.dv_pad : p.v.row_stride;
    const int64_t cols_pad = round_up(cols, plan.key_step);
    // Entirely allowed structurally for every row?  Rows' lo and hi are monotone, so the first
    // row has the smallest hi and the last row the largest lo.
    const bool partial = !(last.lo <= j0 && first.hi >= j0 + cols - 1);
    // The native softmax (both engines) takes a causal tile's structural masks as the rows'
    // limits (no mask pass, no exponentials past a row's last key; the same bits). The rows'
    // limits are the same for every head of the group. On AMX (the products still cover the
    // whole tile): N = 2048, D = 64 causal 4.53–4.69 → 4.32–4.55 ms, N = 512 2–5% less.
    const bool limits = plan.native_softmax && round_in_softmax && !stats &&
                        row_limits(p, {b, g * G, i0, rows, j0, cols, partial}, w.argcol);
    // A whole tile without masks: on AMX its scores go straight from the tiles into their
    // exponentials (amx::qk_exp_tile: the same maxima, P and sums as softmax_rows) instead of
    // through the score tile.
    // Binaries alternated, medians of 5–7, ms: N = 2048, 8 heads, D = 64 5.99 → 5.34, D = 128
    // 9.00 → 8.63; N = 512, D = 64 0.447 → 0.392; N = 8192, one head, D = 64 11.17 → 9.88,
    // D = 128 16.61 → 16.15.
    const bool fused = plan.amx && plan.native_softmax && round_in_softmax && raw_scores &&
                       !stats && !partial && o.mask.kind == MaskKind::none && cols == cols_pad &&
                       cols % 64 == 0 && rows <= static_cast<int64_t>(kernels::amx::kMaxQkExpRows);
    for (int64_t hg = 0; hg < G; ++hg) {
      const int64_t h = g * G + hg;
      const TilePos tile{b, h, i0, rows, j0, cols, partial};
      float* o_hg = w.o + hg * plan.br * plan.dv_pad;
      if (fused) {
        const auto [q_hg, ldq] = q_rows(hg);
        // The rows' sums [rows16, 16] and maxima [rows] in the score tile, which this path leaves
        // unused.
        float* sums = w.s;
        float* m_new = w.s + round_up(rows, 16) * 16;
        kernels::amx::qk_exp_tile(
            q_hg, static_cast<size_t>(ldq), static_cast<size_t>(rows),
            reinterpret_cast<const uint32_t*>(kt), static_cast<size_t>(plan.kt_words),
            static_cast<size_t>(plan.pairs), static_cast<size_t>(cols), effective_scale(p),
            w.m + hg * plan.br, m_new, w.pb, static_cast<size_t>(plan.ldpb), sums);
        if (kernels::native::commit_tile_sums(
                sums, m_new, static_cast<size_t>(rows), w.m + hg * plan.br,
                w.l + hg * plan.br * plan.lanes, w.alpha, w.pb, static_cast<size_t>(plan.ldpb),
                static_cast<size_t>(cols), rounded ? w.lr + hg * plan.br * plan.lanes : nullptr)) {
          pv_tile_bf16(plan, w, nullptr, rows, cols, kt, o_hg, w.alpha, first_row_columns(p, tile),
                       fresh);
          continue;
        }
      }
      if (plan.bf16) {
        const auto [q_hg, ldq] = q_rows(hg);
        score_tile(p, plan, reinterpret_cast<const float*>(q_hg), ldq, tile, kt, w.s, raw_scores,
                   !limits);
      } else
        score_tile(p, plan, p.q.at(b, h, i0), p.q.row_stride, tile, kt, w.s);
      float* m = w.m + hg * plan.br;
      float* l = w.l + hg * plan.br * plan.lanes;
      if (plan.native_softmax && round_in_softmax && !stats)
        kernels::native::softmax_rows(w.s, static_cast<size_t>(rows), static_cast<size_t>(cols_pad),
                                      static_cast<size_t>(plan.bc_pad), m, l, w.alpha,
                                      raw_scores ? effective_scale(p) : 1.0f, w.pb,
                                      static_cast<size_t>(plan.ldpb), limits ? w.argcol : nullptr,
                                      rounded ? w.lr + hg * plan.br * plan.lanes : nullptr);
      else
        kernels::softmax_rows(w.s, rows, cols_pad, plan.bc_pad, m, l, w.alpha,
                              {.ent = stats ? w.ent + hg * plan.br : nullptr,
                               .argmax = stats ? w.argcol : nullptr,
                               .scale = raw_scores ? effective_scale(p) : 1.0f,
                               .pb = round_in_softmax ? w.pb : nullptr,
                               .ldpb = static_cast<size_t>(plan.ldpb),
                               .lr = rounded ? w.lr + hg * plan.br * plan.lanes : nullptr});
      if (stats)
        for (int64_t r = 0; r < rows; ++r)
          if (w.argcol[r] >= 0) w.best[hg * plan.br + r] = j0 + w.argcol[r];
      if (o.dropout_p > 0) apply_dropout(p, tile, w.s, plan.bc_pad);
      if (plan.bf16)
        pv_tile_bf16(plan, w, round_in_softmax ? nullptr : w.s, rows, cols, kt, o_hg, w.alpha,
                     first_row_columns(p, tile), fresh);
      else  // on a diagonal, each block of rows up to its last key (the weights past it are 0)
        for_diagonal_blocks(
            rows, cols, first_row_columns(p, tile), [&](int64_t r0, int64_t n, int64_t keys) {
              kernels::pv_tile(w.s + r0 * plan.bc_pad, plan.bc_pad, n, keys, v, ldv, plan.dv_pad,
                               w.o + (hg * plan.br + r0) * plan.dv_pad, plan.dv_pad, w.alpha + r0);
            });
    }
  }
  if (fresh) std::fill(w.o, w.o + G * plan.br * plan.dv_pad, 0.0f);  // no key block visited
}

// The running sums of rows [0, rows) of head hg (l, or lr: per-lane sums laid out as w.l) into
// out: each row's lanes added in a fixed order (lane 0 first), eight rows side by side so that
// their chains of dependent additions overlap (one row at a time, the chain's latency had been a
// tenth of the forward at D = 32); where the native bf16 softmax (vdpbf16ps or AMX) keeps both l
// and lr, eight rows in one vector pass, in SumEight's order.
void row_sums(const Plan& plan, const float* l, int64_t hg, int64_t rows, float* out) {
  constexpr int64_t kSide = 8;
  const int64_t nl = plan.lanes;
  const float* lanes = l + hg * plan.br * nl;
  if (plan.rounded_sums && plan.lanes == 16 && kernels::bf16_native()) {
    // the native bf16 tiles: both sums in vector passes
    kernels::native::lane_sums(lanes, static_cast<size_t>(rows), out);
    return;
  }
  int64_t r0 = 0;
  for (; r0 + kSide <= rows; r0 += kSide) {
    float acc[kSide] = {};
    for (int64_t x = 0; x < nl; ++x)
      for (int64_t k = 0; k < kSide; ++k) acc[k] += lanes[(r0 + k) * nl + x];
    std::copy_n(acc, kSide, out + r0);
  }
  for (; r0 < rows; ++r0) {
    float l = 0;
    for (int64_t x = 0; x < nl; ++x) l += lanes[r0 * nl + x];
    out[r0] = l;
  }
}

// One finished row: its unnormalised output o, running maximum m and sum l, (for the
// statistics) ent = Σ p̃ (s − m) and the key of the maximum, and the sum that o is divided by:
// l, or the sum of P as rounded to bf16 (plan.rounded_sums).
struct RowResult {
  const float* o;
  float m, l, ent;
  int64_t best;
  float norm;
};

// The row's statistics (lse and those asked for); inv = 1 / l, or 0 when l = 0.
void write_row_stats(const AttentionParams& p, int64_t b, int64_t h, int64_t i, const RowResult& r,
                     float inv) {
  const int64_t flat = (b * p.shape.heads + h) * p.shape.len_q + i;
  const bool nan = std::isnan(r.l);
  if (p.lse) p.lse[flat] = r.l > 0 ? r.m + std::log(r.l) : (nan ? r.l : kNegInf);
  if (p.entropy) p.entropy[flat] = r.l > 0 ? std::log(r.l) - r.ent / r.l : (nan ? r.l : 0.0f);
  if (p.max_weight) p.max_weight[flat] = r.l > 0 ? inv : (nan ? r.l : 0.0f);
  if (p.argmax) p.argmax[flat] = r.l > 0 ? r.best : -1;
}

// out[b, h, i, :] = o / norm and lse = m + log l (0 and −inf for a row with no allowed key), and
// the statistics when asked for: entropy = log l − ent / l, max weight = 1 / l.
void write_row(const AttentionParams& p, int64_t b, int64_t h, int64_t i, const RowResult& r) {
  const float inv = r.l > 0 ? 1.0f / r.norm : 0.0f;
  if (p.out.is_bf16()) {
    constexpr int64_t kChunk = 64;  // scaled into a buffer, then rounded as an array
    float scaled[kChunk];
    for (int64_t x0 = 0; x0 < p.shape.value_dim; x0 += kChunk) {
      const int64_t n = std::min(kChunk, p.shape.value_dim - x0);
      for (int64_t x = 0; x < n; ++x) scaled[x] = r.o[x0 + x] * inv;
      to_bf16(scaled, p.out.bf16_at(b, h, i) + x0, static_cast<size_t>(n));
    }
  } else {
    float* dst = p.out.at(b, h, i);
    for (int64_t x = 0; x < p.shape.value_dim; ++x) dst[x] = r.o[x] * inv;
  }
  write_row_stats(p, b, h, i, r, r.l > 0 ? 1.0f / r.l : 0.0f);
}

void run_item(const AttentionParams& p, const Plan& plan, const Scratch& w, const float* blocks,
              int64_t b, int64_t g, int64_t i0, int64_t rows) {
  accumulate_item(p, plan, w, blocks, b, g, i0, rows, 0, p.shape.len_kv);
  const bool stats = wants_stats(p);
  // The rows of a head are scaled by 1 / l in one vector pass: into a float32 output where it
  // lies; into a bf16 output, scaled and rounded in the same pass on AVX-512 BF16, else scaled in
  // place and rounded in one call when its rows are contiguous, as the accumulators' are (Dv a
  // whole number of vectors; at D = 32 per-row rounding calls had been a tenth of the forward).
  // Other bf16 outputs go row by row (write_row). The same bits every way: each element is
  // o · (1 / l), rounded once (l: the sum of P as rounded where plan.rounded_sums).
  const int64_t Dv = p.shape.value_dim;
  const bool bf16_out = p.out.is_bf16();
  const bool slab = bf16_out && p.out.row_stride == Dv && plan.dv_pad == Dv;
  const bool by_rows = bf16_out && !slab && !plan.native_softmax;
  for (int64_t hg = 0; hg < plan.group; ++hg) {
    const int64_t h = g * plan.group + hg;
    float* o = w.o + hg * plan.br * plan.dv_pad;
    float* inv = w.alpha;  // free once the item's tiles are done: l, then 1 / l
    row_sums(plan, w.l, hg, rows, inv);
    // The sums o is divided by: l, or those of P as rounded (in w.ent, free without statistics).
    const bool rounded = rounded_sums(p, plan);
    float* norm = rounded ? w.ent : inv;
    if (rounded) row_sums(plan, w.lr, hg, rows, norm);
    if (plan.native_softmax && !stats && p.lse) {
      // The native bf16 forward: 1 / l and the log-sum-exp of every row in one vector pass (logf
      // per row had been 5% of the forward at the GPT engine's shape).
      kernels::finish_rows(w.m + hg * plan.br, inv, static_cast<size_t>(rows), inv,
                           p.lse + (b * p.shape.heads + h) * p.shape.len_q + i0,
                           rounded ? norm : nullptr);
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t k = hg * plan.br + r;
        const RowResult row{o + r * plan.dv_pad,    w.m[k], inv[r], stats ? w.ent[k] : 0.0f,
                            stats ? w.best[k] : -1, norm[r]};
        if (by_rows) {
          write_row(p, b, h, i0 + r, row);
          continue;
        }
        inv[r] = row.l > 0 ? 1.0f / row.l : 0.0f;
        write_row_stats(p, b, h, i0 + r, row, inv[r]);
      }
      if (rounded)  // 1 / the sum of P as rounded (rows with l = 0 or NaN keep their 0 or NaN)
        for (int64_t r = 0; r < rows; ++r)
          if (inv[r] > 0) inv[r] = 1.0f / norm[r];
    }
    const auto n = static_cast<size_t>(rows), width = static_cast<size_t>(Dv);
    const auto ldo = static_cast<size_t>(plan.dv_pad), ldd = static_cast<size_t>(p.out.row_stride);
    if (!bf16_out)
      kernels::scale_rows(o, ldo, n, width, inv, p.out.at(b, h, i0), ldd);
    else if (plan.native_softmax)
      kernels::native::scale_round_rows(o, ldo, n, width, inv, p.out.bf16_at(b, h, i0), ldd);
    else if (slab) {
      kernels::scale_rows(o, width, n, width, inv, o, width);
      to_bf16(o, p.out.bf16_at(b, h, i0), n * width);
    }
  }
}

// Decode (few query rows, many keys): the key range is cut into splits of decode_split_blocks key
// blocks, a number that depends on the shape only, never on the thread count; each (batch, kv
// head, split) item leaves its
// partial state per row (o, then m, l, ent and the key of the maximum), and the splits are merged
// in order:
//   M = max_s m_s,  L = Σ_s e^(m_s − M) l_s,  O = Σ_s e^(m_s − M) o_s,  out = O / L,
//   ent = Σ_s e^(m_s − M) (ent_s + (m_s − M) l_s),  argmax = that of the first split with m_s = M.
//
// Keys packed (pack: the keys are not read in place) and the partial states share the arena the
// context keeps across calls (a buffer allocated per call was mapped and zeroed by the kernel
// each time: 135 KB at 32/8 heads and 4,096 keys).
void run_decode(ThreadContext& ctx, const AttentionParams& p, const Plan& plan, bool pack) {
  const AttentionShape& sh = p.shape;
  const bool stats = wants_stats(p);
  const int64_t G = plan.group, rows = sh.len_q, width = plan.dv_pad + 5;
  // Offsets in a row's state: m, l, ent, argmax and the sum o is divided by (RowResult::norm).
  const int64_t M = plan.dv_pad, L = M + 1, E = M + 2, A = M + 3, N = M + 4;
  const bool rounded = rounded_sums(p, plan);
  const int64_t split_blocks = decode_split_blocks(p, plan);
  const int64_t splits = (plan.kv_blocks + split_blocks - 1) / split_blocks;
  const int64_t state = G * rows * width;
  const size_t packed_size =
      pack ? static_cast<size_t>(round_up(static_cast<int64_t>(packed_floats(p, plan)), 16)) : 0;
  float* shared = ctx.shared_scratch().floats(
      packed_size +
      static_cast<size_t>(checked_numel({sh.batch * sh.kv_heads * splits, state}, "decode state")));
  const float* packed = pack ? shared : nullptr;
  if (pack) pack_keys_into(ctx, p, plan, shared);
  float* partial = shared + packed_size;
  // Item (bg, split): its tiles, and its rows' partial states written to `partial`.
  auto run_split = [&](int64_t item, int worker) {
    const int64_t split = item % splits, bg = item / splits;
    const int64_t b = bg / sh.kv_heads, g = bg % sh.kv_heads;
    const Scratch w = carve(ctx.scratch(worker).floats(plan.total()), plan);
    const int64_t key_lo = split * split_blocks * kBlockKeys;
    accumulate_item(p, plan, w, packed ? blocks_of(p, plan, packed, b, g) : nullptr, b, g, 0, rows,
                    key_lo, key_lo + split_blocks * kBlockKeys);
    float* dst = partial + item * state;
    for (int64_t hg = 0; hg < G; ++hg) {
      row_sums(plan, w.l, hg, rows, w.alpha);              // free once the item's tiles are done
      if (rounded) row_sums(plan, w.lr, hg, rows, w.ent);  // free without statistics
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t k = hg * plan.br + r;
        float* row = dst + (hg * rows + r) * width;
        std::memcpy(row, w.o + k * plan.dv_pad, static_cast<size_t>(plan.dv_pad) * sizeof(float));
        row[M] = w.m[k];
        row[L] = w.alpha[r];
        row[E] = stats ? w.ent[k] : 0.0f;
        row[A] = stats ? static_cast<float>(w.best[k]) : -1.0f;  // exact below 2^24 keys
        row[N] = rounded ? w.ent[r] : w.alpha[r];
      }
    }
  };
  // Row (bg, hg, r): its splits' states merged in split order, and written out; o is a buffer of
  // plan.dv_pad floats.
  auto merge_row = [&](int64_t item, float* o) {
    const int64_t r = item % rows, hg = (item / rows) % G, bg = item / (rows * G);
    const float* first = partial + bg * splits * state + (hg * rows + r) * width;
    float m = kNegInf;
    bool nan = false;
    int64_t best = -1;
    for (int64_t s = 0; s < splits; ++s) {
      const float ms = first[s * state + M];
      nan = nan || std::isnan(ms);
      if (ms > m) {
        m = ms;
        best = static_cast<int64_t>(first[s * state + A]);
      }
    }
    std::fill(o, o + plan.dv_pad, 0.0f);
    float l = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f, ent = 0.0f, norm = l;
    if (!nan && m > kNegInf) {
      for (int64_t s = 0; s < splits; ++s) {
        const float* part = first + s * state;
        if (part[M] == kNegInf) continue;
        const float scale = std::exp(part[M] - m);
        l += scale * part[L];
        norm += scale * part[N];
        ent += scale * (part[E] + (part[M] - m) * part[L]);
        for (int64_t x = 0; x < plan.dv_pad; ++x) o[x] += scale * part[x];
      }
    }
    write_row(p, bg / sh.kv_heads, (bg % sh.kv_heads) * G + hg, r, {o, m, l, ent, best, norm});
  };
  const int64_t pairs = sh.batch * sh.kv_heads, pair_rows = G * rows;
  if (pairs >= kDecodePairsPerThread * ctx.num_threads()) {
    // Enough (batch, kv head) pairs to share out whole: an item runs a pair's splits one after the
    // other (its key and value streams run on from one to the next) and merges them itself, from
    // states still in its own cache, in the same parallel region. The splits and the merge are
    // those below, so the bits are the same; only which thread runs what differs. Two regions
    // with the merge's states read from the other core had cost 10-20 µs a call (32 heads over
    // 8, D = 128, 4,096 keys: about 4% of it).
    ctx.parallel_items(pairs, [&](int64_t bg, int worker) {
      std::vector<float> o(static_cast<size_t>(plan.dv_pad));
      for (int64_t split = 0; split < splits; ++split) run_split(bg * splits + split, worker);
      for (int64_t k = 0; k < pair_rows; ++k) merge_row(bg * pair_rows + k, o.data());
    });
    return;
  }
  ctx.parallel_items(pairs * splits, run_split);
  ctx.parallel_items(pairs * pair_rows, [&](int64_t item, int) {
    std::vector<float> o(static_cast<size_t>(plan.dv_pad));
    merge_row(item, o.data());
  });
}

}  // namespace

std::string flash_target() {
  return kernels::target_name();
}

void flash_forward(ThreadContext& ctx, const AttentionParams& p) {
  apply_isa_from_environment();
  validate(p, /*backward=*/false);
  check(p.probs == nullptr,
        "flash_forward: the fused kernel does not materialise probabilities; call probabilities() "
        "with the log-sum-exp it saves");
  const AttentionShape& sh = p.shape;
  if (sh.batch == 0 || sh.heads == 0 || sh.len_q == 0) return;
  const Plan plan = make_plan(p);
  if (p.kv_layout == KvLayout::blocked && !plan.blocked) {
    // A blocked cache off decode's vdpbf16ps loops (more rows, another CPU): read as rows.
    std::vector<bf16> k, v;
    flash_forward(ctx, with_row_cache(p, k, v));
    return;
  }
  if (is_decode(p, plan)) {
    // Decode reads each key once: in place when the value rows are whole vectors wide (the
    // tiles then need no padding; bf16 rows widened as they are loaded, for few rows per
    // key/value head: decode_in_place), packed otherwise.
    run_decode(ctx, p, plan, !(plan.v_in_place || plan.in_place_bf16));
    return;
  }
  const int64_t q_blocks = (sh.len_q + plan.br - 1) / plan.br;
  const int64_t heads_kv = sh.batch * sh.kv_heads;
  const int64_t pair_bytes = plan.kv_blocks * plan.block_floats * int64_t{sizeof(float)};
  const int64_t threads = ctx.num_threads();
  if ((plan.kv_blocks <= kLocalPackBlocks || pair_bytes <= kLocalPackBytes) &&
      (heads_kv >= kLocalPackItemsPerThread * threads || heads_kv % threads == 0)) {
    // Few keys (or a pair's blocks within L2) and many (batch, key/value head) pairs: an item is
    // a whole pair, which packs its own key blocks into its scratch and runs every query block
    // against them there, in L2 (the same tiles and sums as below: the same bits).
    const size_t scratch = static_cast<size_t>(round_up(static_cast<int64_t>(plan.total()), 16));
    const auto local = static_cast<size_t>(plan.kv_blocks * plan.block_floats);
    ctx.parallel_items(heads_kv, [&](int64_t bg, int worker) {
      const int64_t b = bg / sh.kv_heads, g = bg % sh.kv_heads;
      float* base = ctx.scratch(worker).floats(scratch + local);
      float* blocks = base + scratch;
      for (int64_t blk = 0; blk < plan.kv_blocks; ++blk)
        pack_block(p, plan, b, g, blk, blocks + blk * plan.block_floats);
      const Scratch w = carve(base, plan);
      for (int64_t i0 = 0; i0 < sh.len_q; i0 += plan.br)
        run_item(p, plan, w, blocks, b, g, i0, std::min(plan.br, sh.len_q - i0));
    });
    return;
  }
  const float* packed = pack_keys(ctx, p, plan);
  ctx.parallel_items(heads_kv * q_blocks, [&](int64_t item, int worker) {
    // Last query blocks first: with a causal mask they have the most keys, so big items start
    // early.
    const int64_t qb = q_blocks - 1 - item % q_blocks, g = (item / q_blocks) % sh.kv_heads;
    const int64_t b = item / (q_blocks * sh.kv_heads);
    const int64_t i0 = qb * plan.br;
    const Scratch w = carve(ctx.scratch(worker).floats(plan.total()), plan);
    run_item(p, plan, w, blocks_of(p, plan, packed, b, g), b, g, i0,
             std::min(plan.br, sh.len_q - i0));
  });
}

void probabilities(ThreadContext& ctx, const AttentionParams& p,
                   const ProbabilitiesRequest& request, float* out) {
  apply_isa_from_environment();
  const AttentionShape& sh = p.shape;
  check(p.q.defined() && (sh.len_kv == 0 || p.k.defined()),
        "probabilities: query and key pointers are required");
  AttentionParams checked = p;
  checked.out.bf16 = nullptr;  // validate() wants an output; ours is `out` (float32)
  checked.out.data = out;
  validate(checked, /*backward=*/false);
  std::vector<int64_t> heads = request.heads;
  if (heads.empty())
    for (int64_t h = 0; h < sh.heads; ++h) heads.push_back(h);
  for (int64_t h : heads)
    check(h >= 0 && h < sh.heads, "probabilities: head {} out of range [0, {})", h, sh.heads);
  const int64_t row_begin = request.row_begin;
  const int64_t row_end = request.row_end < 0 ? sh.len_q : request.row_end;
  check(0 <= row_begin && row_begin <= row_end && row_end <= sh.len_q,
        "probabilities: rows [{}, {}) out of range [0, {}]", row_begin, row_end, sh.len_q);
  const int64_t nh = static_cast<int64_t>(heads.size()), nrows = row_end - row_begin;
  if (sh.batch == 0 || nh == 0 || nrows == 0 || sh.len_kv == 0) {
    std::fill(out, out + sh.batch * nh * nrows * sh.len_kv, 0.0f);
    return;
  }
  check(p.lse != nullptr, "probabilities: the log-sum-exp saved by a forward (lse) is required");
  if (p.kv_layout == KvLayout::blocked) {  // the tiles read rows
    std::vector<bf16> k, v;
    probabilities(ctx, with_row_cache(p, k, v), request, out);
    return;
  }
  const Plan plan = make_plan(p);
  const float* packed = pack_keys(ctx, p, plan);
  const int64_t row_blocks = (nrows + plan.br - 1) / plan.br;
  ctx.parallel_items(sh.batch * nh * row_blocks, [&](int64_t item, int worker) {
    const int64_t rb = item % row_blocks, hi = (item / row_blocks) % nh;
    const int64_t b = item / (row_blocks * nh), h = heads[static_cast<size_t>(hi)];
    const int64_t g = h / plan.group;
    const int64_t i0 = row_begin + rb * plan.br, rows = std::min(plan.br, row_end - i0);
    const Scratch w = carve(ctx.scratch(worker).floats(plan.total()), plan);
    const float* lse = p.lse + (b * sh.heads + h) * sh.len_q + i0;
    float* dst = out + ((b * nh + hi) * nrows + (i0 - row_begin)) * sh.len_kv;
    std::fill(dst, dst + rows * sh.len_kv, 0.0f);  // keys outside every row's range stay 0
    if (plan.amx) amx_configure_tiles();
    if (plan.bf16) pack_query_pairs(p, plan, b, h, i0, rows, reinterpret_cast<uint32_t*>(w.q));
    const KeyRange first = key_range(p, b, i0), last = key_range(p, b, i0 + rows - 1);
    const int64_t j_begin = std::max<int64_t>(first.lo, 0);
    const int64_t j_end = std::min(last.hi + 1, sh.len_kv);
    const float* blocks = blocks_of(p, plan, packed, b, g);
    for (int64_t j0 = j_begin / kBlockKeys * kBlockKeys; j0 < j_end; j0 += kBlockKeys) {
      const int64_t cols = std::min(kBlockKeys, j_end - j0);
      const TilePos tile{b, h, i0, rows, j0, cols, !(last.lo <= j0 && first.hi >= j0 + cols - 1)};
      if (plan.bf16)
        score_tile(p, plan, w.q, plan.pairs, tile, blocks + (j0 / kBlockKeys) * plan.block_floats,
                   w.s);
      else
        score_tile(p, plan, p.q.at(b, h, i0), p.q.row_stride, tile,
                   blocks + (j0 / kBlockKeys) * plan.block_floats, w.s);
      kernels::exp_shift_rows(w.s, rows, round_up(cols, plan.key_step), plan.bc_pad, lse);
      if (p.options.dropout_p > 0) apply_dropout(p, tile, w.s, plan.bc_pad);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * sh.len_kv + j0, w.s + r * plan.bc_pad,
                    static_cast<size_t>(cols) * sizeof(float));
    }
  });
}

}  // namespace headlight::attention::cpu

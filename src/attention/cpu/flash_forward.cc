// Fused attention forward on the CPU: tiling, partitioning, scratch and dispatch. The SIMD inner
// loops are in flash_forward-inl.h; the formulas are those of params.h, and reference::forward is
// the specification this kernel is tested against.
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
// (GQA/MQA read K and V once per group). Before the items run, every key block of Bc keys is packed
// once as Kᵀ [D, Bc] and V [Bc, Dv] (zero-padded to whole vectors, from any input strides) into a
// buffer kept across calls; each item then visits its key blocks and, per head:
//     QkTile → soft-cap → per-element bias and masks → SoftmaxRows → (dropout) → PvTile.
// Causal, window and key-length masks are structural: each row i allows the key range
// [lo(i), hi(i)], both non-decreasing in i, so the item visits only the key blocks that meet the
// union of its rows' ranges (blocks entirely outside are skipped, not masked) and applies
// element masks only on blocks that are partly outside. Boolean/additive masks and ALiBi apply per
// element on every visited block.
//
// Memory traffic per item: Q once, K and V once per item (Br·group rows reuse each tile), O once.
// With Br = 48 and D = 64 a key tile is reused 48·group times from L1/L2.
//
// Threads take items dynamically; each item is computed by one thread in a fixed order, so the
// output is bitwise the same for any thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/attention/cpu/flash_forward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "src/attention/cpu/flash_forward-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/core/tensor.h"
#include "src/attention/reference/row_scores.h"

namespace headlight {

HWY_EXPORT(QkTile);
HWY_EXPORT(SoftcapTile);
HWY_EXPORT(SoftmaxRows);
HWY_EXPORT(PvTile);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(ExpShiftRows);

namespace attention::cpu {
namespace {

constexpr int64_t kBlockRows = 48;   // Br: query rows per item and head (≤ kMaxSoftmaxRows)
constexpr int64_t kBlockKeys = 128;  // Bc: keys per tile
// Decode: at most this many query rows, split into pieces of this many key blocks.
constexpr int64_t kDecodeRows = 16;
constexpr int64_t kDecodeSplitBlocks = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// The keys row i may attend to, from the structural masks: [lo, hi] inclusive (empty if lo > hi).
struct KeyRange {
  int64_t lo, hi;
};

KeyRange key_range(const AttentionParams& p, int64_t b, int64_t i) {
  const AttentionOptions& o = p.options;
  const int64_t pos =
      i + (o.alignment == Alignment::bottom_right ? p.shape.len_kv - p.shape.len_q : 0);
  int64_t lo = 0, hi = p.shape.len_kv - 1;
  if (o.causal) hi = std::min(hi, pos);
  if (o.window_left >= 0) lo = std::max(lo, pos - o.window_left);
  if (o.window_right >= 0) hi = std::min(hi, pos + o.window_right);
  if (o.key_lengths) hi = std::min(hi, o.key_lengths[b] - 1);
  return {lo, hi};
}

// Sizes of one call's tiles, and the per-thread scratch carved from them (in floats).
struct Plan {
  int64_t lanes, group, dv_pad, bc_pad, br;
  int64_t kv_blocks;     // key blocks per (batch, kv head)
  int64_t block_floats;  // one packed key block: Kᵀ [D, bc_pad] then V [bc_pad, dv_pad]
  size_t q_floats, s_floats, o_floats, row_floats;
  size_t total() const {
    return q_floats + s_floats + o_floats + row_floats * (2 + static_cast<size_t>(lanes));
  }
};

struct Scratch {
  float* q;      // [group, br, D] scaled queries
  float* s;      // [br, bc_pad] scores, then probabilities
  float* o;      // [group, br, dv_pad] unnormalised outputs
  float* m;      // [group·br] running maxima
  float* l;      // [group·br, lanes] running sums, per lane
  float* alpha;  // [br]
};

Scratch carve(float* base, const Plan& plan) {
  Scratch s;
  s.q = base;
  s.s = s.q + plan.q_floats;
  s.o = s.s + plan.s_floats;
  s.m = s.o + plan.o_floats;
  s.l = s.m + plan.row_floats;
  s.alpha = s.l + plan.row_floats * static_cast<size_t>(plan.lanes);
  return s;
}

// Where a tile sits: batch b, query head h, rows [i0, i0 + rows), keys [j0, j0 + cols).
struct TilePos {
  int64_t b, h, i0, rows, j0, cols;
  bool partial;  // some row's structural key range does not cover the whole tile
};

// Per-element part of the scores of one tile: ALiBi, the additive mask, and −inf where the
// boolean mask or (on partial tiles) the structural ranges forbid; padded columns become −inf.
void apply_element_masks(const AttentionParams& p, const TilePos& t, int64_t cols_pad, float* s,
                         int64_t lds) {
  const AttentionOptions& o = p.options;
  const int64_t b = t.b, h = t.h, i0 = t.i0, rows = t.rows, j0 = t.j0, cols = t.cols;
  const bool partial = t.partial;
  const int64_t shift = o.alignment == Alignment::bottom_right ? p.shape.len_kv - p.shape.len_q : 0;
  const bool per_element = o.alibi_slopes || o.mask.kind != MaskKind::none;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    const int64_t i = i0 + r, pos = i + shift;
    const KeyRange range = partial ? key_range(p, b, i) : KeyRange{j0, j0 + cols - 1};
    if (!per_element) {
      // Only the structural ranges: −inf before lo and after hi (and on the padding).
      const int64_t lo = std::clamp<int64_t>(range.lo - j0, 0, cols);
      const int64_t hi = std::clamp<int64_t>(range.hi - j0 + 1, lo, cols);
      std::fill(row, row + lo, kNegInf);
      std::fill(row + hi, row + cols_pad, kNegInf);
      continue;
    }
    for (int64_t c = cols; c < cols_pad; ++c) row[c] = kNegInf;
    const float slope = o.alibi_slopes ? o.alibi_slopes[h] : 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t j = j0 + c;
      if (j < range.lo || j > range.hi || !reference::mask_allows(o.mask, b, h, i, j)) {
        row[c] = kNegInf;
        continue;
      }
      float x = row[c];
      if (o.alibi_slopes) x -= slope * static_cast<float>(std::llabs(pos - j));
      if (o.mask.kind == MaskKind::additive)
        x += static_cast<float>(reference::mask_bias(o.mask, b, h, i, j));
      row[c] = x;
    }
  }
}

// s[rows, bc_pad] = the final scores of the tile: scale·Q·Kᵀ (the scale is in q_scaled), soft-cap,
// ALiBi and masks; −inf where not allowed and on the padding.
void score_tile(const AttentionParams& p, const Plan& plan, const float* q_scaled, const TilePos& t,
                const float* kt, float* s) {
  const int64_t D = p.shape.head_dim;
  const int64_t cols_pad = round_up(t.cols, plan.lanes);
  HWY_DYNAMIC_DISPATCH(QkTile)(q_scaled, D, t.rows, kt, plan.bc_pad, D, cols_pad, s, plan.bc_pad);
  if (p.options.softcap > 0)
    HWY_DYNAMIC_DISPATCH(SoftcapTile)(s, t.rows, cols_pad, plan.bc_pad, p.options.softcap);
  apply_element_masks(p, t, cols_pad, s, plan.bc_pad);
}

void apply_dropout(const AttentionParams& p, const TilePos& t, float* s, int64_t lds) {
  const AttentionOptions& o = p.options;
  const int64_t b = t.b, h = t.h, i0 = t.i0, rows = t.rows, j0 = t.j0, cols = t.cols;
  const CounterRng rng(o.dropout_seed);
  const float inv_keep = 1.0f / (1.0f - o.dropout_p);
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t base = static_cast<uint64_t>(
        ((b * p.shape.heads + h) * p.shape.len_q + i0 + r) * p.shape.len_kv + j0);
    for (int64_t c = 0; c < cols; ++c)
      s[r * lds + c] *=
          rng.uniform(base + static_cast<uint64_t>(c)) >= o.dropout_p ? inv_keep : 0.0f;
  }
}

// Packs key block `blk` of (b, g): Kᵀ [D, bc_pad] and V [bc_pad, dv_pad], zero-padded, from any
// strides. Done once per call and read by every query block of the group.
void pack_block(const AttentionParams& p, const Plan& plan, int64_t b, int64_t g, int64_t blk,
                float* dst) {
  const int64_t D = p.shape.head_dim, Dv = p.shape.value_dim;
  const int64_t j0 = blk * kBlockKeys, cols = std::min(kBlockKeys, p.shape.len_kv - j0);
  float* kt = dst;
  float* v = dst + D * plan.bc_pad;
  for (int64_t e = 0; e < D; ++e)
    std::fill(kt + e * plan.bc_pad + cols, kt + (e + 1) * plan.bc_pad, 0.0f);
  for (int64_t c = 0; c < cols; ++c) {
    const float* k = p.k.at(b, g, j0 + c);
    for (int64_t e = 0; e < D; ++e) kt[e * plan.bc_pad + c] = k[e];
    float* vr = v + c * plan.dv_pad;
    std::memcpy(vr, p.v.at(b, g, j0 + c), static_cast<size_t>(Dv) * sizeof(float));
    std::fill(vr + Dv, vr + plan.dv_pad, 0.0f);
  }
  std::fill(v + cols * plan.dv_pad, v + plan.bc_pad * plan.dv_pad, 0.0f);
}

// Tile sizes and scratch for one call on p.
Plan make_plan(const AttentionParams& p) {
  const AttentionShape& sh = p.shape;
  Plan plan;
  plan.lanes = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(FloatLanes)());
  plan.group = sh.heads / sh.kv_heads;
  plan.dv_pad = round_up(std::max<int64_t>(sh.value_dim, 1), plan.lanes);
  plan.bc_pad = round_up(kBlockKeys, plan.lanes);
  plan.br = std::min(kBlockRows, sh.len_q);
  const auto D = static_cast<size_t>(sh.head_dim), G = static_cast<size_t>(plan.group);
  const auto br = static_cast<size_t>(plan.br), bc = static_cast<size_t>(plan.bc_pad);
  plan.q_floats = round_up(static_cast<int64_t>(G * br * D), 16);
  plan.kv_blocks = (sh.len_kv + kBlockKeys - 1) / kBlockKeys;
  plan.block_floats =
      round_up(static_cast<int64_t>(D * bc + bc * static_cast<size_t>(plan.dv_pad)), 16);
  plan.s_floats = br * bc;
  plan.o_floats = G * br * static_cast<size_t>(plan.dv_pad);
  plan.row_floats = round_up(static_cast<int64_t>(G * br), 16);

  return plan;
}

// Packs every key/value block once (O(L_kv · (D + Dv)) memory, kept across calls in the shared
// arena) and returns the packed blocks, [batch, kv_heads, kv_blocks, block_floats].
const float* pack_keys(ThreadContext& ctx, const AttentionParams& p, const Plan& plan) {
  const AttentionShape& sh = p.shape;
  const int64_t pack_items = sh.batch * sh.kv_heads * plan.kv_blocks;
  float* packed = ctx.shared_scratch().floats(
      static_cast<size_t>(checked_numel({pack_items, plan.block_floats}, "packed keys")));
  ctx.parallel_items(pack_items, [&](int64_t item, int) {
    const int64_t blk = item % plan.kv_blocks, bg = item / plan.kv_blocks;
    pack_block(p, plan, bg / sh.kv_heads, bg % sh.kv_heads, blk, packed + item * plan.block_floats);
  });
  return packed;
}

// Copies the scaled query rows [i0, i0 + rows) of head h into dst [rows, D].
void pack_queries(const AttentionParams& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  float* dst) {
  const int64_t D = p.shape.head_dim;
  const float scale = effective_scale(p);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = p.q.at(b, h, i0 + r);
    for (int64_t e = 0; e < D; ++e) dst[r * D + e] = src[e] * scale;
  }
}

// Runs the tiles of one item over the key blocks that meet [key_lo, key_hi) and the rows'
// structural ranges, leaving the running state (o, m, per-lane l) in w.
void accumulate_item(const AttentionParams& p, const Plan& plan, const Scratch& w,
                     const float* packed, int64_t b, int64_t g, int64_t i0, int64_t rows,
                     int64_t key_lo, int64_t key_hi) {
  const AttentionShape& sh = p.shape;
  const AttentionOptions& o = p.options;
  const int64_t D = sh.head_dim, G = plan.group;

  // Pack the scaled queries of every head of the group, and reset the running state.
  for (int64_t hg = 0; hg < G; ++hg)
    pack_queries(p, b, g * G + hg, i0, rows, w.q + hg * plan.br * D);
  std::fill(w.o, w.o + G * plan.br * plan.dv_pad, 0.0f);
  std::fill(w.m, w.m + G * plan.br, kNegInf);
  std::fill(w.l, w.l + G * plan.br * plan.lanes, 0.0f);

  // The union of the rows' key ranges: first and last row bound it (ranges are monotone).
  const KeyRange first = key_range(p, b, i0), last = key_range(p, b, i0 + rows - 1);
  const int64_t j_begin = std::max({first.lo, key_lo, int64_t{0}});
  const int64_t j_end = std::min({last.hi + 1, key_hi, sh.len_kv});
  const float* blocks = packed + (b * sh.kv_heads + g) * plan.kv_blocks * plan.block_floats;
  for (int64_t j0 = j_begin / kBlockKeys * kBlockKeys; j0 < j_end; j0 += kBlockKeys) {
    const int64_t cols = std::min(kBlockKeys, sh.len_kv - j0);
    const float* kt = blocks + (j0 / kBlockKeys) * plan.block_floats;
    const float* v = kt + D * plan.bc_pad;
    const int64_t cols_pad = round_up(cols, plan.lanes);
    // Entirely allowed structurally for every row?  Rows' lo and hi are monotone, so the first
    // row has the smallest hi and the last row the largest lo.
    const bool partial = !(last.lo <= j0 && first.hi >= j0 + cols - 1);
    for (int64_t hg = 0; hg < G; ++hg) {
      const int64_t h = g * G + hg;
      const TilePos tile{b, h, i0, rows, j0, cols, partial};
      score_tile(p, plan, w.q + hg * plan.br * D, tile, kt, w.s);
      float* m = w.m + hg * plan.br;
      float* l = w.l + hg * plan.br * plan.lanes;
      HWY_DYNAMIC_DISPATCH(SoftmaxRows)(w.s, rows, cols_pad, plan.bc_pad, m, l, w.alpha);
      if (o.dropout_p > 0) apply_dropout(p, tile, w.s, plan.bc_pad);
      HWY_DYNAMIC_DISPATCH(PvTile)
      (w.s, plan.bc_pad, rows, cols_pad, v, plan.dv_pad, plan.dv_pad,
       w.o + hg * plan.br * plan.dv_pad, plan.dv_pad, w.alpha);
    }
  }
}

// The running sum of row (hg, r): its lanes added in a fixed order.
float row_sum(const Plan& plan, const Scratch& w, int64_t hg, int64_t r) {
  const float* lanes = w.l + (hg * plan.br + r) * plan.lanes;
  float l = 0;
  for (int64_t x = 0; x < plan.lanes; ++x) l += lanes[x];
  return l;
}

// out[b, h, i, :] = o / l and lse = m + log l (0 and −inf for a row with no allowed key).
void write_row(const AttentionParams& p, int64_t b, int64_t h, int64_t i, const float* o, float m,
               float l) {
  float* dst = p.out.at(b, h, i);
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  for (int64_t x = 0; x < p.shape.value_dim; ++x) dst[x] = o[x] * inv;
  if (p.lse)
    p.lse[(b * p.shape.heads + h) * p.shape.len_q + i] =
        l > 0 ? m + std::log(l) : (std::isnan(l) ? l : kNegInf);
}

void run_item(const AttentionParams& p, const Plan& plan, const Scratch& w, const float* packed,
              int64_t b, int64_t g, int64_t i0, int64_t rows) {
  accumulate_item(p, plan, w, packed, b, g, i0, rows, 0, p.shape.len_kv);
  for (int64_t hg = 0; hg < plan.group; ++hg)
    for (int64_t r = 0; r < rows; ++r)
      write_row(p, b, g * plan.group + hg, i0 + r, w.o + (hg * plan.br + r) * plan.dv_pad,
                w.m[hg * plan.br + r], row_sum(plan, w, hg, r));
}

// Decode (few query rows, many keys): the key range is cut into a fixed number of splits that
// depends only on L_kv, never on the thread count; each (batch, kv head, split) item leaves its
// partial state [group·rows, dv_pad + 2] (o, then m and l), and the splits are merged in order:
//   M = max_s m_s,  L = Σ_s e^(m_s − M) l_s,  O = Σ_s e^(m_s − M) o_s,  out = O / L.
void run_decode(ThreadContext& ctx, const AttentionParams& p, const Plan& plan,
                const float* packed) {
  const AttentionShape& sh = p.shape;
  const int64_t G = plan.group, rows = sh.len_q, width = plan.dv_pad + 2;
  const int64_t splits = (plan.kv_blocks + kDecodeSplitBlocks - 1) / kDecodeSplitBlocks;
  const int64_t state = G * rows * width;
  std::vector<float> partial(static_cast<size_t>(sh.batch * sh.kv_heads * splits * state));
  ctx.parallel_items(sh.batch * sh.kv_heads * splits, [&](int64_t item, int worker) {
    const int64_t split = item % splits, bg = item / splits;
    const int64_t b = bg / sh.kv_heads, g = bg % sh.kv_heads;
    const Scratch w = carve(ctx.scratch(worker).floats(plan.total()), plan);
    const int64_t key_lo = split * kDecodeSplitBlocks * kBlockKeys;
    accumulate_item(p, plan, w, packed, b, g, 0, rows, key_lo,
                    key_lo + kDecodeSplitBlocks * kBlockKeys);
    float* dst = partial.data() + item * state;
    for (int64_t hg = 0; hg < G; ++hg)
      for (int64_t r = 0; r < rows; ++r) {
        float* row = dst + (hg * rows + r) * width;
        std::memcpy(row, w.o + (hg * plan.br + r) * plan.dv_pad,
                    static_cast<size_t>(plan.dv_pad) * sizeof(float));
        row[plan.dv_pad] = w.m[hg * plan.br + r];
        row[plan.dv_pad + 1] = row_sum(plan, w, hg, r);
      }
  });
  ctx.parallel_items(sh.batch * sh.kv_heads * G * rows, [&](int64_t item, int) {
    const int64_t r = item % rows, hg = (item / rows) % G, bg = item / (rows * G);
    const float* first = partial.data() + bg * splits * state + (hg * rows + r) * width;
    float m = kNegInf;
    bool nan = false;
    for (int64_t s = 0; s < splits; ++s) {
      const float ms = first[s * state + plan.dv_pad];
      nan = nan || std::isnan(ms);
      m = std::max(m, ms);
    }
    std::vector<float> o(static_cast<size_t>(plan.dv_pad), 0.0f);
    float l = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    if (!nan && m > kNegInf) {
      for (int64_t s = 0; s < splits; ++s) {
        const float* part = first + s * state;
        const float ms = part[plan.dv_pad];
        if (ms == kNegInf) continue;
        const float scale = std::exp(ms - m);
        l += scale * part[plan.dv_pad + 1];
        for (int64_t x = 0; x < plan.dv_pad; ++x) o[static_cast<size_t>(x)] += scale * part[x];
      }
    }
    write_row(p, bg / sh.kv_heads, (bg % sh.kv_heads) * G + hg, r, o.data(), m, l);
  });
}

}  // namespace

std::string flash_target() {
  return hwy::TargetName(hwy::SupportedAndGeneratedTargets()[0]);
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
  const float* packed = pack_keys(ctx, p, plan);

  if (sh.len_q <= kDecodeRows && plan.kv_blocks > kDecodeSplitBlocks) {
    run_decode(ctx, p, plan, packed);
    return;
  }
  const int64_t q_blocks = (sh.len_q + plan.br - 1) / plan.br;
  const int64_t items = sh.batch * sh.kv_heads * q_blocks;
  ctx.parallel_items(items, [&](int64_t item, int worker) {
    // Last query blocks first: with a causal mask they have the most keys, so big items start
    // early.
    const int64_t qb = q_blocks - 1 - item % q_blocks, g = (item / q_blocks) % sh.kv_heads;
    const int64_t b = item / (q_blocks * sh.kv_heads);
    const int64_t i0 = qb * plan.br;
    const Scratch w = carve(ctx.scratch(worker).floats(plan.total()), plan);
    run_item(p, plan, w, packed, b, g, i0, std::min(plan.br, sh.len_q - i0));
  });
}

void probabilities(ThreadContext& ctx, const AttentionParams& p,
                   const ProbabilitiesRequest& request, float* out) {
  apply_isa_from_environment();
  const AttentionShape& sh = p.shape;
  check(p.q.data != nullptr && (sh.len_kv == 0 || p.k.data != nullptr),
        "probabilities: query and key pointers are required");
  AttentionParams checked = p;
  checked.out.data = out;  // validate() wants an output; ours is `out`
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
  const Plan plan = make_plan(p);
  const float* packed = pack_keys(ctx, p, plan);
  const int64_t row_blocks = (nrows + plan.br - 1) / plan.br;
  ctx.parallel_items(sh.batch * nh * row_blocks, [&](int64_t item, int worker) {
    const int64_t rb = item % row_blocks, hi = (item / row_blocks) % nh;
    const int64_t b = item / (row_blocks * nh), h = heads[static_cast<size_t>(hi)];
    const int64_t g = h / plan.group;
    const int64_t i0 = row_begin + rb * plan.br, rows = std::min(plan.br, row_end - i0);
    const Scratch w = carve(ctx.scratch(worker).floats(plan.total()), plan);
    pack_queries(p, b, h, i0, rows, w.q);
    const float* lse = p.lse + (b * sh.heads + h) * sh.len_q + i0;
    float* dst = out + ((b * nh + hi) * nrows + (i0 - row_begin)) * sh.len_kv;
    std::fill(dst, dst + rows * sh.len_kv, 0.0f);  // keys outside every row's range stay 0
    const KeyRange first = key_range(p, b, i0), last = key_range(p, b, i0 + rows - 1);
    const int64_t j_begin = std::max<int64_t>(first.lo, 0);
    const int64_t j_end = std::min(last.hi + 1, sh.len_kv);
    const float* blocks = packed + (b * sh.kv_heads + g) * plan.kv_blocks * plan.block_floats;
    for (int64_t j0 = j_begin / kBlockKeys * kBlockKeys; j0 < j_end; j0 += kBlockKeys) {
      const int64_t cols = std::min(kBlockKeys, sh.len_kv - j0);
      const TilePos tile{b, h, i0, rows, j0, cols, !(last.lo <= j0 && first.hi >= j0 + cols - 1)};
      score_tile(p, plan, w.q, tile, blocks + (j0 / kBlockKeys) * plan.block_floats, w.s);
      HWY_DYNAMIC_DISPATCH(ExpShiftRows)(w.s, rows, round_up(cols, plan.lanes), plan.bc_pad, lse);
      if (p.options.dropout_p > 0) apply_dropout(p, tile, w.s, plan.bc_pad);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * sh.len_kv + j0, w.s + r * plan.bc_pad,
                    static_cast<size_t>(cols) * sizeof(float));
    }
  });
}

}  // namespace attention::cpu
}  // namespace headlight

#endif  // HWY_ONCE

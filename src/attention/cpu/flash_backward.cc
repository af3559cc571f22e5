// Fused attention backward on the CPU (FlashAttention-2's backward, Dao 2023), deterministic.
//
// The math, per query row i and key j (P from the saved lse, P' = P ⊙ keep after dropout):
//     P_ij = exp(s_ij − lse_i)                       s recomputed by the forward's score_tile
//     dV_j += Σ_i P'_ij dO_i                         dP'_ij = dO_i · V_j,  dP = dP' ⊙ keep
//     D_i   = dO_i · O_i  (= Σ_j P_ij dP_ij)          dS_ij = P_ij (dP_ij − D_i) [· (1 − t²)
//     soft-cap] dQ_i += scale Σ_j dS_ij K_j                    dK_j += scale Σ_i dS_ij Q_i
// Five tile products per (query block × key block): S = Q·Kᵀ, dP' = dO·Vᵀ, dV += P'ᵀ·dO,
// dK += dSᵀ·Q, dQ += dS·K — the 2.5× of the forward's two that the FLOP convention counts.
//
// Determinism without atomics. A work item is (batch b, kv head g, chunk c of query rows); the
// number of chunks depends only on L_q (at most 4), never on the thread count. An item walks the
// key blocks in order and, inside each, the query blocks of its chunk for every head of the group:
// dQ of its rows is accumulated in the item's scratch (no other item touches those rows), dK and
// dV of the key block in registers-sized tiles that go to the chunk's slice of a partial buffer.
// The chunks' partial dK and dV are then added in chunk order (a single chunk writes dK and dV in
// place). Memory beyond the inputs: packed Kᵀ and Vᵀ (and K, and the chunk's dO, when their rows
// are not whole vectors wide; otherwise they are read where they lie), the chunk's packed Q and
// dQ, and the partials: O((L_q + chunks·L_kv)·D).

#include "headlight/attention/cpu/flash_backward.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/tensor.h"
#include "src/attention/cpu/flash_kernels.h"
#include "src/attention/cpu/flash_tiles.h"

namespace headlight::attention::cpu {
namespace {

constexpr int64_t kMaxChunks = 4;
constexpr int64_t kChunkRows = 1024;  // one more chunk per this many query rows, up to kMaxChunks

// Per-call sizes of the backward (on top of the forward's Plan).
struct BackwardPlan {
  Plan base;
  int64_t d_pad;       // head_dim padded to whole vectors
  int64_t chunks;      // query-row chunks
  int64_t chunk_rows;  // rows per chunk (the last may have fewer)
  // Rows whole vectors wide are read where they lie: K (for dQ += dS·K) when D = d_pad, dO when
  // Dv = dv_pad; otherwise they are copied, zero-padded.
  bool k_in_place, dout_in_place;
  int64_t block_floats;  // packed key block: Kᵀ [D, bc_pad], Vᵀ [Dv, bc_pad], K [bc_pad, d_pad]
};

BackwardPlan make_backward_plan(const AttentionParams& p) {
  const AttentionShape& sh = p.shape;
  BackwardPlan bp;
  bp.base = make_plan(p);
  bp.d_pad = round_up(std::max<int64_t>(sh.head_dim, 1), bp.base.lanes);
  bp.chunks = std::clamp<int64_t>((sh.len_q + kChunkRows - 1) / kChunkRows, 1, kMaxChunks);
  bp.chunk_rows = (sh.len_q + bp.chunks - 1) / bp.chunks;
  const int64_t bc = bp.base.bc_pad;
  bp.k_in_place = sh.head_dim == bp.d_pad;
  bp.dout_in_place = sh.value_dim == bp.base.dv_pad;
  bp.block_floats =
      round_up(sh.head_dim * bc + sh.value_dim * bc + (bp.k_in_place ? 0 : bc * bp.d_pad), 16);
  return bp;
}

// Packs key block `blk` of (b, g) for the backward: Kᵀ [D, bc_pad], Vᵀ [Dv, bc_pad] and, unless
// it is read in place, K [bc_pad, d_pad], zero-padded.
void pack_backward_block(const AttentionParams& p, const BackwardPlan& bp, int64_t b, int64_t g,
                         int64_t blk, float* dst) {
  const int64_t D = p.shape.head_dim, Dv = p.shape.value_dim, bc = bp.base.bc_pad;
  const int64_t j0 = blk * kBlockKeys, cols = std::min(kBlockKeys, p.shape.len_kv - j0);
  float* kt = dst;
  float* vt = kt + D * bc;
  float* kn = vt + Dv * bc;
  pack_transposed(p.k, b, g, j0, cols, D, 1.0f, kt, bc);
  pack_transposed(p.v, b, g, j0, cols, Dv, 1.0f, vt, bc);
  if (bp.k_in_place) return;
  for (int64_t c = 0; c < cols; ++c) {
    std::memcpy(kn + c * bp.d_pad, p.k.at(b, g, j0 + c), static_cast<size_t>(D) * sizeof(float));
    std::fill(kn + c * bp.d_pad + D, kn + (c + 1) * bp.d_pad, 0.0f);
  }
  std::fill(kn + cols * bp.d_pad, kn + bc * bp.d_pad, 0.0f);
}

// One worker's scratch for an item.
struct BackwardScratch {
  float* q;     // [group, chunk_rows, d_pad] scaled queries
  float* dout;  // [group, chunk_rows, dv_pad] output gradients
  float* dq;    // [group, chunk_rows, d_pad] accumulated dQ / scale
  float* dk;    // [bc_pad, d_pad] dK of the current key block
  float* dv;    // [bc_pad, dv_pad] dV of the current key block
  float* s;     // [br, bc_pad] scores, then P
  float* pd;    // [br, bc_pad] P after dropout
  float* dp;    // [br, bc_pad] dP, then dS
  float* aux;   // [br, bc_pad] dropout factors or soft-cap derivatives
};

size_t backward_scratch_floats(const AttentionParams& p, const BackwardPlan& bp) {
  const int64_t G = bp.base.group, rows = bp.chunk_rows, bc = bp.base.bc_pad;
  return static_cast<size_t>(G * rows * (2 * bp.d_pad + bp.base.dv_pad) + bc * bp.d_pad +
                             bc * bp.base.dv_pad + 4 * bp.base.br * bc);
}

BackwardScratch carve_backward(float* base, const BackwardPlan& bp) {
  const int64_t G = bp.base.group, rows = bp.chunk_rows, bc = bp.base.bc_pad;
  BackwardScratch w;
  w.q = base;
  w.dout = w.q + G * rows * bp.d_pad;
  w.dq = w.dout + G * rows * bp.base.dv_pad;
  w.dk = w.dq + G * rows * bp.d_pad;
  w.dv = w.dk + bc * bp.d_pad;
  w.s = w.dv + bc * bp.base.dv_pad;
  w.pd = w.s + bp.base.br * bc;
  w.dp = w.pd + bp.base.br * bc;
  w.aux = w.dp + bp.base.br * bc;
  return w;
}

struct ItemRange {
  int64_t b, g, c, row_begin, row_end;
};

// Where an item's dK and dV rows go: row j of its (b, g) at k + j·k_ld and v + j·v_ld.
struct KeyGradRows {
  float* k;
  int64_t k_ld;
  float* v;
  int64_t v_ld;
  // Rows [j_begin, j_end) of dK (D wide) and dV (Dv wide) set to 0.
  void zero(int64_t j_begin, int64_t j_end, int64_t D, int64_t Dv) const {
    for (int64_t j = j_begin; j < j_end; ++j) {
      std::fill(k + j * k_ld, k + j * k_ld + D, 0.0f);
      std::fill(v + j * v_ld, v + j * v_ld + Dv, 0.0f);
    }
  }
};

// One item: every key block against the chunk's query rows of every head of the group.
void run_backward_item(const AttentionParams& p, const BackwardPlan& bp, const BackwardScratch& w,
                       const float* packed, const float* dot, const KeyGradRows& out,
                       const ItemRange& it) {
  const AttentionShape& sh = p.shape;
  const AttentionOptions& o = p.options;
  const Plan& plan = bp.base;
  const int64_t G = plan.group, D = sh.head_dim, Dv = sh.value_dim, bc = plan.bc_pad;
  const int64_t rows_total = it.row_end - it.row_begin, cr = bp.chunk_rows;
  const float scale = effective_scale(p);

  // Pack the chunk's scaled queries and (unless read in place) output gradients, zero-padded;
  // zero dQ.
  std::fill(w.q, w.q + G * cr * bp.d_pad, 0.0f);
  if (!bp.dout_in_place) std::fill(w.dout, w.dout + G * cr * plan.dv_pad, 0.0f);
  std::fill(w.dq, w.dq + G * cr * bp.d_pad, 0.0f);
  for (int64_t hg = 0; hg < G; ++hg) {
    const int64_t h = it.g * G + hg;
    for (int64_t r = 0; r < rows_total; ++r) {
      const float* q = p.q.at(it.b, h, it.row_begin + r);
      float* qd = w.q + (hg * cr + r) * bp.d_pad;
      for (int64_t e = 0; e < D; ++e) qd[e] = q[e] * scale;
      if (!bp.dout_in_place)
        std::memcpy(w.dout + (hg * cr + r) * plan.dv_pad, p.dout.at(it.b, h, it.row_begin + r),
                    static_cast<size_t>(Dv) * sizeof(float));
    }
  }
  const int64_t ld_dout = bp.dout_in_place ? p.dout.row_stride : plan.dv_pad;
  const int64_t ld_k = bp.k_in_place ? p.k.row_stride : bp.d_pad;

  const auto [j_begin, j_end] = rows_key_span(p, it.b, it.row_begin, it.row_end);
  const float* blocks = packed + (it.b * sh.kv_heads + it.g) * plan.kv_blocks * bp.block_floats;
  for (int64_t blk = 0; blk < plan.kv_blocks; ++blk) {
    const int64_t j0 = blk * kBlockKeys, cols = std::min(kBlockKeys, sh.len_kv - j0);
    if (j0 + cols <= j_begin || j0 >= j_end) {  // no row of the chunk sees this block
      out.zero(j0, j0 + cols, D, Dv);
      continue;
    }
    const float* kt = blocks + blk * bp.block_floats;
    const float* vt = kt + D * bc;
    const float* kn = bp.k_in_place ? p.k.at(it.b, it.g, j0) : vt + Dv * bc;
    std::fill(w.dk, w.dk + bc * bp.d_pad, 0.0f);
    std::fill(w.dv, w.dv + bc * plan.dv_pad, 0.0f);
    for (int64_t hg = 0; hg < G; ++hg) {
      const int64_t h = it.g * G + hg;
      for (int64_t i0 = it.row_begin; i0 < it.row_end; i0 += plan.br) {
        const int64_t rows = std::min(plan.br, it.row_end - i0);
        const KeyRange lo_row = key_range(p, it.b, i0), hi_row = key_range(p, it.b, i0 + rows - 1);
        if (hi_row.hi < j0 || lo_row.lo > j0 + cols - 1) continue;  // block outside these rows
        // Keys past these rows' range are not computed (the causal diagonal).
        const int64_t tcols = std::min(cols, hi_row.hi + 1 - j0);
        const int64_t cols_pad = round_up(tcols, plan.lanes);
        const TilePos tile{
            it.b, h, i0, rows, j0, tcols, !(hi_row.lo <= j0 && lo_row.hi >= j0 + tcols - 1)};
        const float* q = w.q + (hg * cr + i0 - it.row_begin) * bp.d_pad;
        const float* dout = bp.dout_in_place ? p.dout.at(it.b, h, i0)
                                             : w.dout + (hg * cr + i0 - it.row_begin) * plan.dv_pad;
        float* dq = w.dq + (hg * cr + i0 - it.row_begin) * bp.d_pad;
        const float* lse = p.lse + (it.b * sh.heads + h) * sh.len_q + i0;
        const float* dot_rows = dot + (it.b * sh.heads + h) * sh.len_q + i0;
        // S, with the soft-cap derivative kept aside before the masks change S.
        kernels::qk_tile(q, bp.d_pad, rows, kt, bc, D, cols_pad, w.s, bc);
        if (o.softcap > 0) {
          kernels::softcap_tile(w.s, rows, cols_pad, bc, o.softcap);
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(w.aux + r * bc, w.s + r * bc,
                        static_cast<size_t>(cols_pad) * sizeof(float));
          kernels::softcap_grad_tile(w.aux, rows, cols_pad, bc, o.softcap);
        }
        apply_element_masks(p, tile, cols_pad, w.s, bc);
        kernels::exp_shift_rows(w.s, rows, cols_pad, bc, lse);  // P
        // dP' = dO · Vᵀ.
        kernels::qk_tile(dout, ld_dout, rows, vt, bc, Dv, cols_pad, w.dp, bc);
        const float* pd = backward_dropout(p, tile, w.s, w.pd, w.dp, cols_pad, bc);
        kernels::accumulate_transposed(pd, bc, rows, cols_pad, dout, ld_dout, plan.dv_pad, w.dv,
                                       plan.dv_pad);
        kernels::softmax_grad_tile(w.s, w.dp, rows, cols_pad, bc, dot_rows);  // dS
        if (o.softcap > 0) kernels::mul_tile(w.dp, w.aux, rows, cols_pad, bc);
        kernels::accumulate_transposed(w.dp, bc, rows, cols_pad, q, bp.d_pad, bp.d_pad, w.dk,
                                       bp.d_pad);
        // dS is 0 past tcols; K's rows there are not read (in place they may not exist).
        kernels::pv_tile(w.dp, bc, rows, tcols, kn, ld_k, bp.d_pad, dq, bp.d_pad, nullptr);
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      std::copy_n(w.dk + c * bp.d_pad, D, out.k + (j0 + c) * out.k_ld);
      std::copy_n(w.dv + c * plan.dv_pad, Dv, out.v + (j0 + c) * out.v_ld);
    }
  }
  for (int64_t hg = 0; hg < G; ++hg)
    for (int64_t r = 0; r < rows_total; ++r) {
      float* dst = p.dq.at(it.b, it.g * G + hg, it.row_begin + r);
      const float* src = w.dq + (hg * cr + r) * bp.d_pad;
      for (int64_t e = 0; e < D; ++e) dst[e] = src[e] * scale;
    }
}

}  // namespace

void flash_backward(ThreadContext& ctx, const AttentionParams& p) {
  apply_isa_from_environment();
  validate(p, /*backward=*/true);
  const AttentionShape& sh = p.shape;
  if (sh.batch == 0 || sh.kv_heads == 0) return;
  const int64_t D = sh.head_dim, Dv = sh.value_dim;
  if (sh.len_q == 0 || sh.heads == 0) {  // no query: zero key/value gradients
    for (int64_t b = 0; b < sh.batch; ++b)
      for (int64_t g = 0; g < sh.kv_heads; ++g)
        KeyGradRows{p.dk.at(b, g, 0), p.dk.row_stride, p.dv.at(b, g, 0), p.dv.row_stride}.zero(
            0, sh.len_kv, D, Dv);
    return;
  }
  check(p.out.data != nullptr && p.lse != nullptr,
        "flash_backward: the forward's output and log-sum-exp (out, lse) are required");
  const BackwardPlan bp = make_backward_plan(p);
  const Plan& plan = bp.base;

  const std::vector<float> dot = output_dots(ctx, p);
  if (sh.len_kv == 0) {  // no key: every gradient is zero
    for (int64_t b = 0; b < sh.batch; ++b)
      for (int64_t h = 0; h < sh.heads; ++h)
        for (int64_t i = 0; i < sh.len_q; ++i)
          std::fill(p.dq.at(b, h, i), p.dq.at(b, h, i) + D, 0.0f);
    return;
  }

  // One buffer from the context's shared arena (kept across calls, so a training step does not
  // map and fault in fresh pages for it every time): the packed key blocks, then, with several
  // chunks, the chunks' partial dK and dV, [chunks, batch, kv_heads, len_kv, D or Dv], added
  // below in chunk order (one chunk writes dK and dV in place). Every item writes all of its rows
  // (zeros for the blocks its rows do not see), so the partials need no clearing.
  const int64_t pack_items = sh.batch * sh.kv_heads * plan.kv_blocks;
  const int64_t per_bg_k = sh.len_kv * D, per_bg_v = sh.len_kv * Dv;
  const bool partials = bp.chunks > 1;
  const int64_t packed_floats = checked_numel({pack_items, bp.block_floats}, "packed keys");
  const int64_t part_k = partials ? checked_numel({bp.chunks, sh.batch * sh.kv_heads, per_bg_k},
                                                  "partial key gradients")
                                  : 0;
  const int64_t part_v = partials ? checked_numel({bp.chunks, sh.batch * sh.kv_heads, per_bg_v},
                                                  "partial value gradients")
                                  : 0;
  float* packed = ctx.shared_scratch().floats(static_cast<size_t>(packed_floats + part_k + part_v));
  float* const dk_part = packed + packed_floats;
  float* const dv_part = dk_part + part_k;
  ctx.parallel_items(pack_items, [&](int64_t item, int) {
    const int64_t blk = item % plan.kv_blocks, bg = item / plan.kv_blocks;
    pack_backward_block(p, bp, bg / sh.kv_heads, bg % sh.kv_heads, blk,
                        packed + item * bp.block_floats);
  });

  const size_t scratch = backward_scratch_floats(p, bp);
  ctx.parallel_items(sh.batch * sh.kv_heads * bp.chunks, [&](int64_t item, int worker) {
    // Last chunks first: with a causal mask they see the most keys, so the big items start early.
    const int64_t c = bp.chunks - 1 - item % bp.chunks, bg = item / bp.chunks;
    ItemRange it{bg / sh.kv_heads, bg % sh.kv_heads, c, c * bp.chunk_rows,
                 std::min(sh.len_q, (c + 1) * bp.chunk_rows)};
    const KeyGradRows out =
        partials ? KeyGradRows{dk_part + (c * sh.batch * sh.kv_heads + bg) * per_bg_k, D,
                               dv_part + (c * sh.batch * sh.kv_heads + bg) * per_bg_v, Dv}
                 : KeyGradRows{p.dk.at(it.b, it.g, 0), p.dk.row_stride, p.dv.at(it.b, it.g, 0),
                               p.dv.row_stride};
    if (it.row_begin >= it.row_end) {
      out.zero(0, sh.len_kv, D, Dv);
      return;
    }
    const BackwardScratch w = carve_backward(ctx.scratch(worker).floats(scratch), bp);
    run_backward_item(p, bp, w, packed, dot.data(), out, it);
  });
  if (!partials) return;

  add_partials(ctx, p, bp.chunks, dk_part, dv_part);
}

}  // namespace headlight::attention::cpu

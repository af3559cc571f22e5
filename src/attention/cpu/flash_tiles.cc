#include "src/attention/cpu/flash_tiles.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/core/tensor.h"
#include "src/attention/cpu/flash_bf16.h"
#include "src/attention/cpu/flash_kernels.h"

namespace headlight::attention::cpu {

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

KeySpan rows_key_span(const AttentionParams& p, int64_t b, int64_t i0, int64_t i1) {
  const KeyRange first = key_range(p, b, i0), last = key_range(p, b, i1 - 1);
  return {std::max<int64_t>(first.lo, 0), std::min(last.hi + 1, p.shape.len_kv)};
}

Scratch carve(float* base, const Plan& plan) {
  Scratch s;
  s.q = base;
  s.s = s.q + plan.q_floats;
  s.o = s.s + plan.s_floats;
  s.m = s.o + plan.o_floats;
  s.l = s.m + plan.row_floats;
  s.alpha = s.l + plan.row_floats * static_cast<size_t>(plan.lanes);
  s.ent = s.alpha + plan.row_floats;
  s.best = reinterpret_cast<int64_t*>(s.ent + plan.row_floats);  // row_floats is a multiple of 16
  s.argcol = reinterpret_cast<int32_t*>(s.best + plan.row_floats);
  float* rest = reinterpret_cast<float*>(s.argcol + plan.row_floats);
  s.pb = plan.pb_floats ? reinterpret_cast<bf16*>(rest) : nullptr;
  s.lr = rest + plan.pb_floats;  // last: the buffers before it lie where they did without it
  return s;
}

int64_t first_row_columns(const AttentionParams& p, const TilePos& t) {
  if (!t.partial) return t.cols;
  return std::clamp<int64_t>(key_range(p, t.b, t.i0).hi - t.j0 + 1, 0, t.cols);
}

// Per-element part of the scores of one tile: ALiBi, the additive mask, and −inf where the
// boolean mask or (on partial tiles) the structural ranges forbid; padded columns become −inf.
void apply_element_masks(const AttentionParams& p, const TilePos& t, int64_t cols_pad, float* s,
                         int64_t lds) {
  const AttentionOptions& o = p.options;
  const int64_t b = t.b, h = t.h, i0 = t.i0, rows = t.rows, j0 = t.j0, cols = t.cols;
  const bool partial = t.partial;
  const int64_t shift = o.alignment == Alignment::bottom_right ? p.shape.len_kv - p.shape.len_q : 0;
  const bool per_element = o.alibi_slopes || o.mask.kind != MaskKind::none;
  if (!partial && !per_element && cols == cols_pad) return;  // every score of the tile stands
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
      if (j < range.lo || j > range.hi || !o.mask.allows(b, h, i, j)) {
        row[c] = kNegInf;
        continue;
      }
      float x = row[c];
      if (o.alibi_slopes) x -= slope * static_cast<float>(std::llabs(pos - j));
      if (o.mask.kind == MaskKind::additive) x += o.mask.bias(b, h, i, j);
      row[c] = x;
    }
  }
}

// s[rows, bc_pad] = the final scores of the tile: scale·Q·Kᵀ (the scale is in q_scaled), soft-cap,
// ALiBi and masks; −inf where not allowed and on the padding.
bool scale_in_softmax(const AttentionParams& p, const Plan& plan) {
  const AttentionOptions& o = p.options;
  return plan.amx && effective_scale(p) > 0 && o.softcap == 0 && o.alibi_slopes == nullptr &&
         o.mask.kind != MaskKind::additive;
}

bool row_limits(const AttentionParams& p, const TilePos& t, int32_t* out) {
  const AttentionOptions& o = p.options;
  // Tiles inside every row's range need no masks but their padding's (apply_element_masks).
  if (!t.partial || o.alibi_slopes || o.mask.kind != MaskKind::none) return false;
  if (key_range(p, t.b, t.i0 + t.rows - 1).lo > t.j0) return false;  // lo is non-decreasing
  for (int64_t r = 0; r < t.rows; ++r)
    out[r] = static_cast<int32_t>(
        std::clamp<int64_t>(key_range(p, t.b, t.i0 + r).hi - t.j0 + 1, 0, t.cols));
  return true;
}

void score_tile(const AttentionParams& p, const Plan& plan, const float* q, int64_t ldq,
                const TilePos& t, const float* kt, float* s, bool raw, bool masks) {
  const int64_t D = p.shape.head_dim;
  const int64_t cols_pad = round_up(t.cols, plan.key_step);
  if (plan.amx) {  // q: pair words (pack_query_pairs), whole tiles of 16 rows
    kernels::amx::qk_tile(reinterpret_cast<const uint32_t*>(q), static_cast<size_t>(ldq),
                          static_cast<size_t>(round_up(t.rows, 16)),
                          reinterpret_cast<const uint32_t*>(kt), static_cast<size_t>(plan.kt_words),
                          static_cast<size_t>(plan.pairs), static_cast<size_t>(cols_pad),
                          raw ? 1.0f : effective_scale(p), s, static_cast<size_t>(plan.bc_pad));
  } else if (plan.bf16) {  // q: pair words (pack_query_pairs), ldq in words
    // On a diagonal, each block of rows only up to its last row's last key (the columns past it
    // are made −inf by the masks below).
    for_diagonal_blocks(
        t.rows, t.cols, first_row_columns(p, t), [&](int64_t r0, int64_t n, int64_t keys) {
          if (keys == 0) return;
          kernels::qk_tile_bf16(
              reinterpret_cast<const uint32_t*>(q) + r0 * ldq, static_cast<size_t>(ldq),
              static_cast<size_t>(n), reinterpret_cast<const uint32_t*>(kt),
              static_cast<size_t>(plan.kt_words), static_cast<size_t>(plan.pairs),
              static_cast<size_t>(std::min(cols_pad, round_up(keys, 16))), effective_scale(p),
              s + r0 * plan.bc_pad, static_cast<size_t>(plan.bc_pad));
        });
  } else if (kt) {  // on a diagonal, by blocks of rows as the bf16 tiles above
    for_diagonal_blocks(t.rows, t.cols, first_row_columns(p, t),
                        [&](int64_t r0, int64_t n, int64_t keys) {
                          if (keys > 0)
                            kernels::qk_tile(q + r0 * ldq, ldq, n, kt, plan.bc_pad, D,
                                             std::min(cols_pad, round_up(keys, plan.key_step)),
                                             s + r0 * plan.bc_pad, plan.bc_pad);
                        });
  } else {  // keys read where they lie (decode); q is scaled
    kernels::dot_tile(q, ldq, t.rows, p.k.at(t.b, t.h / plan.group, t.j0), p.k.row_stride, D,
                      t.cols, s, plan.bc_pad);
  }
  if (p.options.softcap > 0)
    kernels::softcap_tile(s, t.rows, cols_pad, plan.bc_pad, p.options.softcap);
  if (masks) apply_element_masks(p, t, cols_pad, s, plan.bc_pad);
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

std::vector<float> output_dots(ThreadContext& ctx, const AttentionParams& p) {
  const AttentionShape& sh = p.shape;
  std::vector<float> dot(static_cast<size_t>(sh.batch * sh.heads * sh.len_q));
  // The bf16 backward's (bf16 inputs, whatever the output's dtype) or one with a bf16 operand.
  const bool lanes = p.q.is_bf16() || p.out.bf16 || p.dout.bf16;
  const auto Dv = static_cast<size_t>(sh.value_dim);
  ctx.parallel_for(sh.batch * sh.heads, [&](Range range, int) {
    for (int64_t bh = range.begin; bh < range.end; ++bh) {
      const int64_t b = bh / sh.heads, h = bh % sh.heads;
      float* out = dot.data() + bh * sh.len_q;
      if (lanes) {
        // The bf16 backward's: a head's rows in one vector pass, per-lane running sums (one
        // running sum's chain of dependent additions, and then per-row widening calls, had made
        // this pass 5–8% of a bf16 backward at the GPT engine's shape, B 16, H 4, N 128, D 32).
        auto rows_of = [&](const Operand& x) {
          return std::pair{x.bf16 ? nullptr : static_cast<const float*>(x.at(b, h, 0)),
                           x.bf16 ? static_cast<const bf16*>(x.bf16_at(b, h, 0)) : nullptr};
        };
        const auto [o32, o16] = rows_of(p.out);
        const auto [g32, g16] = rows_of(p.dout);
        kernels::dot_rows(o32, o16, static_cast<size_t>(p.out.row_stride), g32, g16,
                          static_cast<size_t>(p.dout.row_stride), static_cast<size_t>(sh.len_q), Dv,
                          out);
        continue;
      }
      for (int64_t i = 0; i < sh.len_q; ++i) {  // fp32 (the fp32 backward's): in order
        const float *o = p.out.at(b, h, i), *g = p.dout.at(b, h, i);
        float s = 0;
        for (size_t x = 0; x < Dv; ++x) s += o[x] * g[x];
        out[i] = s;
      }
    }
  });
  return dot;
}

void add_partials(ThreadContext& ctx, const AttentionParams& p, int64_t chunks,
                  const float* dk_part, const float* dv_part) {
  const AttentionShape& sh = p.shape;
  const int64_t D = sh.head_dim, Dv = sh.value_dim;
  const int64_t per_bg_k = sh.len_kv * D, per_bg_v = sh.len_kv * Dv;
  const int64_t stride_k = sh.batch * sh.kv_heads * per_bg_k;  // one chunk's partials
  const int64_t stride_v = sh.batch * sh.kv_heads * per_bg_v;
  // Rows [j, j + n) of (b, g) = Σ_c part[c] in chunk order, stored as the operand's dtype; n
  // rows are contiguous in the operand when n > 1. (b, g)'s rows go in one call where the
  // operand's rows are contiguous (the same bits as row by row; at D = 32 the per-row rounding
  // calls had been most of this pass), else one row at a time.
  auto sum_into = [&](const Operand& o, int64_t b, int64_t g, int64_t j, int64_t n,
                      const float* part0, int64_t stride, int64_t width, std::vector<float>& buf) {
    const auto count = static_cast<size_t>(n * width);
    if (o.bf16 && chunks == 1) return to_bf16(part0, o.bf16_at(b, g, j), count);  // rounded once
    if (o.bf16) buf.resize(count);
    float* dst = o.bf16 ? buf.data() : o.at(b, g, j);
    std::memcpy(dst, part0, count * sizeof(float));
    for (int64_t c = 1; c < chunks; ++c) {
      const float* pc = part0 + c * stride;
      for (size_t e = 0; e < count; ++e) dst[e] += pc[e];
    }
    if (o.bf16) to_bf16(dst, o.bf16_at(b, g, j), count);
  };
  auto store = [&](const Operand& o, int64_t b, int64_t g, const float* part0, int64_t stride,
                   int64_t width, std::vector<float>& buf) {
    if (o.row_stride == width) return sum_into(o, b, g, 0, sh.len_kv, part0, stride, width, buf);
    for (int64_t j = 0; j < sh.len_kv; ++j)
      sum_into(o, b, g, j, 1, part0 + j * width, stride, width, buf);
  };
  ctx.parallel_for(sh.batch * sh.kv_heads, [&](Range range, int) {
    std::vector<float> buf;
    for (int64_t bg = range.begin; bg < range.end; ++bg) {
      const int64_t b = bg / sh.kv_heads, g = bg % sh.kv_heads;
      store(p.dk, b, g, dk_part + bg * per_bg_k, stride_k, D, buf);
      store(p.dv, b, g, dv_part + bg * per_bg_v, stride_v, Dv, buf);
    }
  });
}

const float* backward_dropout(const AttentionParams& p, const TilePos& t, const float* s, float* pd,
                              float* dp, int64_t cols_pad, int64_t lds) {
  if (p.options.dropout_p <= 0) return s;
  for (int64_t r = 0; r < t.rows; ++r) std::fill(pd + r * lds, pd + r * lds + cols_pad, 1.0f);
  apply_dropout(p, t, pd, lds);
  kernels::mul_tile(dp, pd, static_cast<size_t>(t.rows), static_cast<size_t>(cols_pad),
                    static_cast<size_t>(lds));
  kernels::mul_tile(pd, s, static_cast<size_t>(t.rows), static_cast<size_t>(cols_pad),
                    static_cast<size_t>(lds));
  return pd;
}

// 16 rows at a time, so that each row of dst is written 16 floats in a row while the 16 source
// rows stay in L1.
void pack_transposed(const Operand& x, int64_t b, int64_t g, int64_t j0, int64_t cols,
                     int64_t width, float scale, float* dst, int64_t ld) {
  for (int64_t e = 0; e < width; ++e) std::fill(dst + e * ld + cols, dst + (e + 1) * ld, 0.0f);
  constexpr int64_t kRows = 16;
  for (int64_t c0 = 0; c0 < cols; c0 += kRows)
    kernels::transpose_rows(x.at(b, g, j0 + c0), static_cast<size_t>(x.row_stride),
                            static_cast<size_t>(std::min(kRows, cols - c0)),
                            static_cast<size_t>(width), scale, dst + c0, static_cast<size_t>(ld));
}

namespace {

uint32_t pair_word(bf16 lo, bf16 hi) {
  return static_cast<uint32_t>(lo.bits) | static_cast<uint32_t>(hi.bits) << 16;
}

// Pair e of a row of `dim` elements (zero past the row's end).
uint32_t pair_at(const bf16* row, int64_t dim, int64_t e) {
  const bf16 zero{};
  return pair_word(2 * e < dim ? row[2 * e] : zero, 2 * e + 1 < dim ? row[2 * e + 1] : zero);
}

}  // namespace

void pack_pairs_transposed(const Operand& x, int64_t b, int64_t g, int64_t j0, int64_t cols,
                           int64_t width, int64_t pairs, int64_t ld, uint32_t* dst) {
  // Zero only what the loops below leave: the columns past `cols` of the pair rows they write,
  // and the pair rows past the row's elements.
  const int64_t written = std::min(pairs, (width + 1) / 2);
  for (int64_t e = 0; e < written; ++e) std::fill(dst + e * ld + cols, dst + (e + 1) * ld, 0u);
  std::fill(dst + written * ld, dst + pairs * ld, 0u);
  // A row's whole pairs are its 32-bit words (read as such), the last odd element alone. Rows
  // that start on words and lie an even number of elements apart are word rows: transposed 16
  // rows at a time, as pack_transposed does.
  const int64_t whole = width / 2;
  const bool word_rows = x.row_stride % 2 == 0 &&
                         reinterpret_cast<uintptr_t>(x.bf16_at(b, g, j0)) % alignof(uint32_t) == 0;
  if (word_rows && whole > 0 && cols > 0) {
    constexpr int64_t kRows = 16;
    for (int64_t c0 = 0; c0 < cols; c0 += kRows)
      kernels::transpose_words(reinterpret_cast<const uint32_t*>(x.bf16_at(b, g, j0 + c0)),
                               static_cast<size_t>(x.row_stride / 2),
                               static_cast<size_t>(std::min(kRows, cols - c0)),
                               static_cast<size_t>(whole), dst + c0, static_cast<size_t>(ld));
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const bf16* row = x.bf16_at(b, g, j0 + c);
      for (int64_t e = 0; e < whole; ++e) {
        uint32_t word;
        std::memcpy(&word, row + 2 * e, 4);
        dst[e * ld + c] = word;
      }
    }
  }
  if (width % 2)
    for (int64_t c = 0; c < cols; ++c)
      dst[whole * ld + c] = pair_at(x.bf16_at(b, g, j0 + c), width, whole);
}

void pack_row_pairs(const Operand& x, int64_t b, int64_t g, int64_t j0, int64_t cols, int64_t width,
                    int64_t rows_pad, int64_t ld, uint32_t* dst) {
  const bf16 zero{};
  for (int64_t c2 = 0; c2 < rows_pad / 2; ++c2) {
    uint32_t* row = dst + c2 * ld;
    const int64_t c = 2 * c2;
    if (c + 1 < cols) {  // branch-free for whole pairs
      const uint16_t* x0 = &x.bf16_at(b, g, j0 + c)->bits;
      const uint16_t* x1 = &x.bf16_at(b, g, j0 + c + 1)->bits;
      kernels::pair_rows(x0, x1, static_cast<size_t>(width), row);
    } else {
      const bf16* x0 = c < cols ? x.bf16_at(b, g, j0 + c) : nullptr;
      for (int64_t e = 0; e < width; ++e) row[e] = pair_word(x0 ? x0[e] : zero, zero);
    }
    std::fill(row + width, row + ld, 0u);
  }
}

namespace {

// bf16: Kᵀ as pair words [pairs, kt_words] and V as pair words [bc_pad / 2, v_words], zero-padded.
void pack_block_bf16(const AttentionParams& p, const Plan& plan, int64_t b, int64_t g, int64_t j0,
                     int64_t cols, uint32_t* dst) {
  pack_pairs_transposed(p.k, b, g, j0, cols, p.shape.head_dim, plan.pairs, plan.kt_words, dst);
  pack_row_pairs(p.v, b, g, j0, cols, p.shape.value_dim, plan.bc_pad, plan.v_words,
                 dst + plan.pairs * plan.kt_words);
}

}  // namespace

// Packs key block `blk` of (b, g): Kᵀ [D, bc_pad] and V [bc_pad, dv_pad], zero-padded, from any
// strides (bf16: pair words, pack_block_bf16). Done once per call and read by every query block of
// the group.
void pack_block(const AttentionParams& p, const Plan& plan, int64_t b, int64_t g, int64_t blk,
                float* dst) {
  const int64_t D = p.shape.head_dim, Dv = p.shape.value_dim;
  const int64_t j0 = blk * kBlockKeys, cols = std::min(kBlockKeys, p.shape.len_kv - j0);
  if (plan.bf16) return pack_block_bf16(p, plan, b, g, j0, cols, reinterpret_cast<uint32_t*>(dst));
  float* v = dst + D * plan.bc_pad;
  pack_transposed(p.k, b, g, j0, cols, D, effective_scale(p), dst, plan.bc_pad);
  if (plan.v_in_place) return;
  for (int64_t c = 0; c < cols; ++c) {
    float* vr = v + c * plan.dv_pad;
    std::memcpy(vr, p.v.at(b, g, j0 + c), static_cast<size_t>(Dv) * sizeof(float));
    std::fill(vr + Dv, vr + plan.dv_pad, 0.0f);
  }
  std::fill(v + cols * plan.dv_pad, v + plan.bc_pad * plan.dv_pad, 0.0f);
}

// Tile sizes and scratch for one call on p.
bool decode_native_bf16(const AttentionParams& p) {
  const AttentionShape& sh = p.shape;
  const auto dim_ok = [](int64_t d) { return d > 0 && d % 32 == 0 && d <= 128; };
  return kernels::bf16_native() && dim_ok(sh.head_dim) && dim_ok(sh.value_dim) &&
         p.k.row_stride % 2 == 0 && p.k.head_stride % 2 == 0 && p.k.batch_stride % 2 == 0 &&
         reinterpret_cast<uintptr_t>(p.k.bf16) % alignof(uint32_t) == 0;
}

bool decode_native_more_rows(const AttentionParams& p) {
  return decode_native_bf16(p) && !kernels::amx::available();
}

namespace {

// AMX: 256 query rows per item (kLongKeys, kLongKvBytes).
bool long_kv_amx(const AttentionShape& sh) {
  const int64_t kv_bytes = sh.len_kv * (sh.head_dim + sh.value_dim) * int64_t{sizeof(bf16)};
  return sh.len_kv >= kLongKeys || kv_bytes >= kLongKvBytes;
}

}  // namespace

Plan make_plan(const AttentionParams& p) {
  const AttentionShape& sh = p.shape;
  Plan plan;
  plan.lanes = static_cast<int64_t>(kernels::float_lanes());
  plan.group = sh.heads / sh.kv_heads;
  plan.bf16 = p.q.is_bf16();
  plan.dv_pad = round_up(std::max<int64_t>(sh.value_dim, 1), plan.lanes);
  plan.kv_blocks = (sh.len_kv + kBlockKeys - 1) / kBlockKeys;
  plan.in_place_bf16 = plan.bf16 && decode_in_place(p, plan);  // (in place implies decode)
  const bool blocked = p.kv_layout == KvLayout::blocked;
  plan.native_decode =
      plan.in_place_bf16 && (plan.group * sh.len_q >= 2 || blocked) && decode_native_bf16(p);
  plan.blocked = blocked && plan.native_decode;
  // One row per key/value head fills a sixteenth of a tile: vdpbf16ps is faster there.
  plan.amx_decode = plan.native_decode && kernels::amx::available() && plan.lanes == 16 &&
                    plan.group * sh.len_q >= 2;
  plan.prefetch_rows = decode_prefetches_rows();
  plan.amx = plan.bf16 && !plan.in_place_bf16 && kernels::amx::available() && plan.lanes == 16;
  plan.native_softmax =
      plan.bf16 && !plan.in_place_bf16 && plan.lanes == 16 && (plan.amx || kernels::bf16_native());
  // Keys per tile, padded: a whole tile, or all the keys when there are fewer.
  if (plan.native_decode) {
    const int64_t rows = plan.group * sh.len_q;
    plan.tile_keys = kDecodeTileKeys;
    while (plan.tile_keys > kBlockKeys &&
           rows * plan.tile_keys * static_cast<int64_t>(sizeof(float)) > kDecodeScoresBytes)
      plan.tile_keys /= 2;
  }
  plan.key_step = plan.bf16 ? std::max<int64_t>(plan.lanes, 2) : plan.lanes;
  plan.bc_pad = round_up(std::min(plan.tile_keys, std::max<int64_t>(sh.len_kv, 1)),
                         plan.amx || plan.amx_decode ? 32 : plan.key_step);
  const AttentionOptions& o = p.options;
  plan.br = std::min(sh.len_q >= kLongRows && !banded(o) ? kBlockRowsLong : kBlockRows, sh.len_q);
  // AMX: whole 16-row tiles; 128 rows without a band (each K and V tile serves twice the rows
  // of 64, and the lazy softmax reads the 128 KiB of scores once: N = 2048, D = 64 6.56 → 6.40
  // ms, medians of 7 alternating runs; N = 512 unchanged), 64 with one (its diagonal tiles waste
  // less than with more rows; 48 had been as fast until amx::qk_exp_tile, whose blocks of two row
  // tiles a third of 48 rows miss: causal D = 64, N = 512, 1024, 2048 3% faster with 64, N = 1024,
  // D = 128 5%, N = 2048, D = 128 the same; 96 and 128 no faster).
  if (plan.amx)
    plan.br = std::min<int64_t>(long_kv_amx(sh) ? 256
                                : banded(o)     ? 64
                                                : 128,
                                round_up(sh.len_q, 16));
  else if (plan.bf16 && !plan.in_place_bf16 && sh.len_kv >= kLongKeys)
    plan.br = std::min(kLongKeyRowsNative, sh.len_q);  // vdpbf16ps or widened
  const auto D = static_cast<size_t>(sh.head_dim), G = static_cast<size_t>(plan.group);
  const auto br = static_cast<size_t>(plan.br), bc = static_cast<size_t>(plan.bc_pad);
  plan.q_floats = round_up(static_cast<int64_t>(G * br * D), 16);
  plan.v_in_place = sh.value_dim == plan.dv_pad && !plan.bf16;
  plan.block_floats = round_up(
      static_cast<int64_t>(D * bc + (plan.v_in_place ? 0 : bc * static_cast<size_t>(plan.dv_pad))),
      16);
  if (plan.bf16 && !plan.in_place_bf16) {
    plan.pairs = (sh.head_dim + 1) / 2;
    if (plan.amx) plan.pairs = round_up(std::max<int64_t>(plan.pairs, 1), 16);
    const auto pairs = static_cast<size_t>(plan.pairs);
    // On AMX the packed V's rows and P's are a cache line longer than their data: rows 512 bytes
    // apart (Dv = 128 words; 256 keys) put a tile's 16 rows into 8 of L1's 64 sets, where P·V's
    // A, B and C tiles crowd each other out (P·V alone 15% faster at D = 128). Binaries
    // alternated, medians of 5, ms: N = 2048, 8 heads, D = 128 8.81 → 8.53, causal 5.34 → 5.24,
    // D = 64 5.68 → 5.56; N = 8192, one head, D = 128 17.2 → 16.8; N = 512, D = 64 0.407 →
    // 0.397 (docs/notes/2026-12-06-padded-tiles.md). Kᵀ's rows too (1 KiB apart for 256 keys: a B
    // tile's 16 rows in 4 sets, a 32-key block of D = 128 not fitting L1): the scores and
    // exponentials alone (a qk_exp_tile stand-in) 5.0 → 4.6 ns a 16 scores at D = 128; the forward,
    // medians of 8 alternating runs of 11, N = 2048, 8 heads, D = 128 9.19 → 8.87 ms, N = 8192, one
    // head 18.5 → 17.7, D = 64 5.86 → 5.72 (docs/notes/2026-12-06-padded-keys.md).
    plan.v_words = plan.dv_pad + (plan.amx ? 16 : 0);
    plan.kt_words = plan.bc_pad + (plan.amx ? 16 : 0);
    plan.q_floats = round_up(static_cast<int64_t>(G * br * std::max<size_t>(pairs, 1)), 16);
    plan.block_floats = round_up(static_cast<int64_t>(pairs * static_cast<size_t>(plan.kt_words) +
                                                      bc / 2 * static_cast<size_t>(plan.v_words)),
                                 16);
    plan.ldpb = plan.bc_pad + (plan.amx ? 32 : 0);
    plan.pb_floats = static_cast<size_t>(round_up(static_cast<int64_t>(br * plan.ldpb / 2), 16));
  }
  // On vdpbf16ps: the group's probabilities rounded for decode_pv_bf16; on AMX, the group's rows
  // in whole tiles of 16, and blocked_pv's spare after pb for a short last step's values.
  const size_t gr = plan.amx_decode ? static_cast<size_t>(round_up(G * br, 16)) : G * br;
  if (plan.native_decode) plan.pb_floats = static_cast<size_t>(round_up(gr * bc / 2, 16));
  if (plan.amx_decode) {
    plan.pb_floats += kernels::amx::kBlockedSpareWords;
    plan.q_floats = std::max(plan.q_floats, gr * D / 2);
  }
  // One head's tile, or (keys in place) the whole group's; every buffer of the scratch starts on
  // a 64-byte boundary (the int64 `best` had lain on a 4-byte one where lanes = 1 made dv_pad odd).
  plan.s_floats = static_cast<size_t>(round_up(static_cast<int64_t>(gr * bc), 16));
  plan.o_floats = static_cast<size_t>(
      round_up(static_cast<int64_t>(gr * static_cast<size_t>(plan.dv_pad)), 16));
  plan.row_floats = round_up(static_cast<int64_t>(G * br), 16);
  // Where P is rounded to bf16 for P·V: packed tiles and decode's loops, on vdpbf16ps or AMX
  // (both take the sums from the rounded rows of P: softmax_rows's pass D, commit_tile_sums).
  plan.rounded_sums = plan.bf16 && (!plan.in_place_bf16 || plan.native_decode);
  return plan;
}

// Packs every key/value block once (O(L_kv · (D + Dv)) memory, kept across calls in the shared
// arena) and returns the packed blocks, [batch, kv_heads, kv_blocks, block_floats].
size_t packed_floats(const AttentionParams& p, const Plan& plan) {
  const AttentionShape& sh = p.shape;
  return static_cast<size_t>(
      checked_numel({sh.batch * sh.kv_heads * plan.kv_blocks, plan.block_floats}, "packed keys"));
}

void pack_keys_into(ThreadContext& ctx, const AttentionParams& p, const Plan& plan, float* packed) {
  const AttentionShape& sh = p.shape;
  ctx.parallel_items(sh.batch * sh.kv_heads * plan.kv_blocks, [&](int64_t item, int) {
    const int64_t blk = item % plan.kv_blocks, bg = item / plan.kv_blocks;
    pack_block(p, plan, bg / sh.kv_heads, bg % sh.kv_heads, blk, packed + item * plan.block_floats);
  });
}

const float* pack_keys(ThreadContext& ctx, const AttentionParams& p, const Plan& plan) {
  float* packed = ctx.shared_scratch().floats(packed_floats(p, plan));
  pack_keys_into(ctx, p, plan, packed);
  return packed;
}

bool amx_queries_in_place(const AttentionParams& p, const Plan& plan, int64_t b, int64_t g,
                          int64_t i0, int64_t rows) {
  constexpr int64_t kLine = 64;
  const Operand& q = p.q;
  const auto line = static_cast<int64_t>(kLine / sizeof(bf16));
  if (!plan.amx || p.shape.head_dim != 2 * plan.pairs || rows % 16 != 0 || q.row_stride % line != 0)
    return false;
  for (int64_t hg = 0; hg < plan.group; ++hg)
    if (reinterpret_cast<uintptr_t>(q.bf16_at(b, g * plan.group + hg, i0)) % kLine != 0)
      return false;
  return true;
}

void pack_query_pairs(const AttentionParams& p, const Plan& plan, int64_t b, int64_t h, int64_t i0,
                      int64_t rows, uint32_t* dst) {
  const int64_t D = p.shape.head_dim, whole = D / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* src = p.q.bf16_at(b, h, i0 + r);
    uint32_t* row = dst + r * plan.pairs;
    std::memcpy(row, src, static_cast<size_t>(whole) * 4);  // whole pairs are the row's words
    for (int64_t e = whole; e < plan.pairs; ++e) row[e] = pair_at(src, D, e);
  }
}

void pv_tile_bf16(const Plan& plan, const Scratch& w, const float* s, int64_t rows, int64_t cols,
                  const float* v_block, float* o, const float* alpha, int64_t first, bool fresh) {
  check(!fresh || plan.amx, "pv_tile_bf16: only the AMX tiles write fresh accumulators");
  const auto bc = static_cast<size_t>(plan.bc_pad);
  const int64_t cols_pad = round_up(cols, plan.key_step);
  if (s)
    kernels::round_tile_bf16(s, bc, static_cast<size_t>(rows), static_cast<size_t>(cols_pad), w.pb,
                             static_cast<size_t>(plan.ldpb));
  if (plan.amx) {
    // Whole tiles: 16 rows, 32 keys; the rows and keys past the tile's are zero.
    const int64_t rows16 = round_up(rows, 16), cols32 = round_up(cols_pad, 32);
    for (int64_t r = 0; r < rows; ++r)
      std::fill(w.pb + r * plan.ldpb + cols_pad, w.pb + r * plan.ldpb + cols32, bf16{});
    std::fill(w.pb + rows * plan.ldpb, w.pb + rows16 * plan.ldpb, bf16{});
    const auto* v = reinterpret_cast<const uint32_t*>(v_block) + plan.pairs * plan.kt_words;
    // Fresh accumulators are written, not loaded: o = P · V, the bits of 0 · α + P · V for a
    // finite α. A row whose α is not finite (NaN: the row saw a NaN) takes the zeros and the
    // scaling as before, so that its output is NaN.
    if (fresh && alpha &&
        !std::all_of(alpha, alpha + rows, [](float a) { return std::isfinite(a); })) {
      std::fill(o, o + rows16 * plan.dv_pad, 0.0f);
      fresh = false;
    }
    if (fresh)
      kernels::amx::product(w.pb, static_cast<size_t>(plan.ldpb), static_cast<size_t>(rows16), v,
                            static_cast<size_t>(plan.v_words), static_cast<size_t>(cols32 / 32),
                            static_cast<size_t>(plan.dv_pad), o, static_cast<size_t>(plan.dv_pad),
                            /*accumulate=*/false);
    else
      kernels::amx::pv_tile(w.pb, static_cast<size_t>(plan.ldpb), static_cast<size_t>(rows16),
                            static_cast<size_t>(cols32 / 2), v, static_cast<size_t>(plan.v_words),
                            static_cast<size_t>(plan.dv_pad), o, static_cast<size_t>(plan.dv_pad),
                            alpha);
    return;
  }
  // On a diagonal, each block of rows only up to its last row's last key (the weights past it
  // are 0: skipping them is exact).
  const auto ldo = static_cast<size_t>(plan.dv_pad);
  for_diagonal_blocks(rows, cols, first, [&](int64_t r0, int64_t n, int64_t keys) {
    kernels::pv_tile_bf16(reinterpret_cast<const uint32_t*>(w.pb + r0 * plan.ldpb),
                          static_cast<size_t>(plan.ldpb / 2), static_cast<size_t>(n),
                          static_cast<size_t>((keys + 1) / 2),
                          reinterpret_cast<const uint32_t*>(v_block) + plan.pairs * plan.kt_words,
                          static_cast<size_t>(plan.v_words), ldo, o + r0 * plan.dv_pad, ldo,
                          alpha ? alpha + r0 : nullptr);
  });
}

// Copies the scaled query rows [i0, i0 + rows) of head h into dst [rows, D].
void pack_queries(const AttentionParams& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  float* dst) {
  const int64_t D = p.shape.head_dim;
  const float scale = effective_scale(p);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < D; ++e) dst[r * D + e] = p.q.value(b, h, i0 + r, e) * scale;
}

}  // namespace headlight::attention::cpu

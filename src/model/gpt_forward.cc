// GPT forward: embeddings, blocks (attention through the fused kernels, MLP), final norm, logits.
// See headlight/model/gpt.h for the block equations.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/ops/layers.h"
#include "headlight/ops/matmul.h"
#include "src/model/gpt_blocks.h"

namespace headlight::model {

namespace detail {

namespace {

// Views of one head-major block of packed rows: q, k and v inside rows [B·T, (H + 2G)·hd]
// (`packed`), or the attention output inside rows [B·T, H·hd] (`heads`).
attention::Operand packed(const Dims& d, float* rows, int64_t first_head) {
  return {.data = rows + first_head * d.hd,
          .batch_stride = d.T * d.W,
          .head_stride = d.hd,
          .row_stride = d.W};
}
attention::Operand heads(const Dims& d, float* rows) {
  return {.data = rows,
          .batch_stride = d.T * d.H * d.hd,
          .head_stride = d.hd,
          .row_stride = d.H * d.hd};
}

}  // namespace

attention::AttentionParams attention_params(const GPTConfig& c, const Dims& d, float* qkv,
                                            float* att, float* lse, const float* alibi) {
  attention::AttentionParams p;
  p.shape = {.batch = d.B,
             .heads = d.H,
             .kv_heads = d.G,
             .len_q = d.T,
             .len_kv = d.T,
             .head_dim = d.hd,
             .value_dim = d.hd};
  p.options.causal = c.causal;
  p.options.alibi_slopes = c.positional == Positional::alibi ? alibi : nullptr;
  p.q = packed(d, qkv, 0);
  p.k = packed(d, qkv, d.H);
  p.v = packed(d, qkv, d.H + d.G);
  p.out = heads(d, att);
  p.lse = lse;
  return p;
}

void set_attention_grads(const Dims& d, float* datt, float* dqkv, attention::AttentionParams& p) {
  p.dout = heads(d, datt);
  p.dq = packed(d, dqkv, 0);
  p.dk = packed(d, dqkv, d.H);
  p.dv = packed(d, dqkv, d.H + d.G);
}

void layer_attention(ThreadContext& ctx, const GPTConfig& c, int64_t layer,
                     const attention::AttentionParams& p, attention::KernelChoice kernel,
                     bool backward) {
  if (p.shape.heads == 0) return;
  auto run = [&](const attention::AttentionParams& q) {
    if (backward)
      attention::backward(ctx, q, kernel);
    else
      attention::forward(ctx, q, kernel);
  };
  if (c.uniform_groups(layer)) return run(p);
  const int64_t B = p.shape.batch, T = p.shape.len_q, S = p.shape.len_kv;
  auto shift = [](attention::Operand o, int64_t by) {
    if (o.data) o.data += by;
    if (o.bf16) o.bf16 += by;
    return o;
  };
  int64_t h0 = 0, gi = 0;
  for (const int64_t n : c.group_sizes(layer)) {
    attention::AttentionParams g = p;
    g.shape.heads = n;
    g.shape.kv_heads = 1;
    g.q = shift(p.q, h0 * p.q.head_stride);
    g.k = shift(p.k, gi * p.k.head_stride);
    g.v = shift(p.v, gi * p.v.head_stride);
    g.out = shift(p.out, h0 * p.out.head_stride);
    g.dout = shift(p.dout, h0 * p.dout.head_stride);
    g.dq = shift(p.dq, h0 * p.dq.head_stride);
    g.dk = shift(p.dk, gi * p.dk.head_stride);
    g.dv = shift(p.dv, gi * p.dv.head_stride);
    const int64_t rows = B * h0 * T;
    if (p.lse) g.lse = p.lse + rows;
    if (p.probs) g.probs = p.probs + rows * S;
    if (p.entropy) g.entropy = p.entropy + rows;
    if (p.argmax) g.argmax = p.argmax + rows;
    if (p.max_weight) g.max_weight = p.max_weight + rows;
    // Each group its own dropout stream (the keep index restarts at the group's first head).
    if (p.options.dropout_p > 0) g.options.dropout_seed = p.options.dropout_seed + 0x9E37 * gi;
    run(g);
    h0 += n;
    ++gi;
  }
}

void dropout(ThreadContext& ctx, float* x, int64_t n, float p, uint64_t seed, uint64_t stream) {
  const float keep_scale = 1.0f / (1.0f - p);
  // One Philox block gives the uniforms of four consecutive elements (CounterRng's numbering).
  ctx.parallel_for((n + 3) / 4, [&](Range r, int) {
    for (int64_t b = r.begin; b < r.end; ++b) {
      const auto bits = philox4x32(seed, stream, static_cast<uint64_t>(b));
      for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j) {
        float& v = x[4 * b + j];
        v = uniform_from_bits(bits[static_cast<size_t>(j)]) >= p ? v * keep_scale : 0.0f;
      }
    }
  });
}

void add(ThreadContext& ctx, int64_t n, const float* a, const float* b, float* out) {
  // In chunks, so that a decoding step's one row (n = C) runs on the calling thread: starting the
  // other threads costs more than its additions.
  constexpr int64_t kChunk = 1 << 14;
  ctx.parallel_for((n + kChunk - 1) / kChunk, [&](Range chunks, int) {
    const int64_t end = std::min(n, chunks.end * kChunk);
    for (int64_t i = chunks.begin * kChunk; i < end; ++i) out[i] = a[i] + b[i];
  });
}

void add_type_embeddings(ThreadContext& ctx, const GPTConfig& c, const Dims& d,
                         const int32_t* types, const float* wtt, float* x) {
  for (int64_t r = 0; r < d.rows; ++r)
    check(types[r] >= 0 && types[r] < c.type_vocab_size,
          "token_types: type {} at index {} is outside [0, type_vocab_size {})", types[r], r,
          c.type_vocab_size);
  ctx.parallel_for(d.rows, [&](Range range, int) {
    for (int64_t r = range.begin; r < range.end; ++r) {
      const float* t = wtt + types[r] * d.C;
      float* row = x + r * d.C;
      for (int64_t j = 0; j < d.C; ++j) row[j] += t[j];
    }
  });
}

namespace {

// A seed derived from `seed` and a counter (hi, lo): Philox's first two words.
uint64_t derived_seed(uint64_t seed, uint64_t hi, uint64_t lo) {
  const auto bits = philox4x32(seed, hi, lo);
  return bits[0] | (static_cast<uint64_t>(bits[1]) << 32);
}

}  // namespace

uint64_t attention_dropout_seed(uint64_t seed, int64_t layer, size_t segment) {
  return derived_seed(seed, 0xA77E + segment, static_cast<uint64_t>(layer));
}

uint64_t micro_batch_seed(uint64_t seed, int64_t part) {
  return derived_seed(seed, 0x3B1C, static_cast<uint64_t>(part));
}

void set_segments(const GPTConfig& c, int64_t batch, int64_t seq, bool cached,
                  const ForwardOptions& o, GPT::State& s) {
  s.segments.clear();
  s.positions.clear();
  if (o.lengths.empty()) {
    s.segments.push_back({.row0 = 0, .batch = batch, .len = seq});
    return;
  }
  check(batch == 1, "lengths: packed sequences need a batch of one row of tokens, got {}", batch);
  check(!cached, "lengths: packed sequences cannot use the KV cache");
  check(o.attention_probs == nullptr && o.attention_entropy == nullptr &&
            o.attention_argmax == nullptr && o.attention_max_weight == nullptr,
        "lengths: packed sequences cannot return attention probabilities or statistics (one "
        "sequence at a time)");
  int64_t row = 0;
  for (int64_t len : o.lengths) {
    check(len > 0 && len <= c.block_size, "lengths: {} is outside [1, block_size {}]", len,
          c.block_size);
    s.segments.push_back({.row0 = row, .batch = 1, .len = len});
    for (int64_t t = 0; t < len; ++t) s.positions.push_back(t);
    row += len;
  }
  check(row == seq, "lengths: they add up to {}, the tokens are {}", row, seq);
}

attention::AttentionParams segment_attention(const GPTConfig& c, const Dims& d, const Segment& g,
                                             int64_t layer, float* qkv, float* att, float* lse,
                                             const GPT::State& s) {
  const Dims ds = dims(c, g.batch, g.len, layer);
  return attention_params(c, ds, qkv + g.row0 * d.W, att + g.row0 * d.H * d.hd, lse + g.row0 * d.H,
                          s.alibi.data());
}

void ensure_tables(const GPTConfig& c, GPT::State& s) {
  if (c.positional == Positional::sinusoidal && s.sinusoidal.empty())
    s.sinusoidal = sinusoidal_table(c.block_size, c.n_embd);
  if (c.positional == Positional::rope && s.rope.cos.empty())
    s.rope = rope_table(c.block_size, c.head_dim(), c.rope_base);
  if (c.positional == Positional::alibi && s.alibi.empty()) s.alibi = alibi_slopes(c.n_head);
}

bool bf16_attention(const GPT::State& s) {
  for (const Segment& g : s.segments)
    if (g.len < kBf16AttentionRows) return false;
  return true;
}

void point_at_bf16(const float* rows, const bf16* rows16,
                   std::initializer_list<attention::Operand*> operands) {
  for (attention::Operand* o : operands) {
    o->bf16 = const_cast<bf16*>(rows16) + (o->data - rows);
    o->data = nullptr;
  }
}

void to_bf16_operands(const float* qkv, const bf16* qkv16, attention::AttentionParams& p) {
  point_at_bf16(qkv, qkv16, {&p.q, &p.k, &p.v});
}

namespace {

template <class T>
void append_rows(const float* src, int64_t ld, int64_t rows, int64_t width, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, bf16>)
      to_bf16(src + r * ld, dst + r * width, static_cast<size_t>(width));
    else
      std::memcpy(dst + r * width, src + r * ld, sizeof(float) * static_cast<size_t>(width));
  }
}

// The cache's keys and values as one layer's attention operands: heads `capacity` rows apart.
attention::Operand cache_operand(float* data, const Dims& d, int64_t capacity) {
  return {.data = data, .batch_stride = 0, .head_stride = capacity * d.hd, .row_stride = d.hd};
}
attention::Operand cache_operand(bf16* data, const Dims& d, int64_t capacity) {
  return {.batch_stride = 0, .head_stride = capacity * d.hd, .row_stride = d.hd, .bf16 = data};
}

// The d.T rows' keys and values rounded to bf16 and put in their places of a blocked cache
// (attention/kv_layout.h): each head a region of `capacity` positions.
void append_blocked(const float* qkv, const Dims& d, int64_t pos0, int64_t capacity, bf16* k,
                    bf16* v) {
  const int64_t hd = d.hd;
  std::vector<bf16> row(static_cast<size_t>(hd));
  for (int64_t g = 0; g < d.G; ++g)
    for (int64_t t = 0; t < d.T; ++t) {
      const float* src = qkv + t * d.W;
      to_bf16(src + (d.H + g) * hd, row.data(), row.size());
      attention::write_blocked_rows(attention::KvSide::keys, row.data(), hd, pos0 + t, 1, hd,
                                    k + g * capacity * hd);
      to_bf16(src + (d.H + d.G + g) * hd, row.data(), row.size());
      attention::write_blocked_rows(attention::KvSide::values, row.data(), hd, pos0 + t, 1, hd,
                                    v + g * capacity * hd);
    }
}

}  // namespace

template <class T>
void use_cache(const GPTConfig& c, const Dims& d, int64_t pos0, const float* qkv, BasicBuffer<T>& k,
               BasicBuffer<T>& v, attention::AttentionParams& p) {
  // Head-major [G, capacity, hd]: each key/value head's positions are contiguous, as decode
  // streams them (a position-major cache, rows G·hd apart, was read 23–48% slower: bf16, 4,096
  // positions, 32 heads over 8 at hd = 128 0.67 → 0.99 ms, 9 over 3 at hd = 64 0.135 → 0.188).
  // A bf16 cache with hd a multiple of 32 lies blocked within each head's region instead
  // (attention/kv_layout.h), which decode reads without rearranging; its capacity is whole chunks,
  // and a key's place does not depend on the capacity. The capacity doubles (up to block_size
  // positions); each head's rows (blocked: its whole region) move then.
  constexpr bool bf16_cache = std::is_same_v<T, bf16>;
  const int64_t hd = d.hd, G = d.G, need = pos0 + d.T;
  const bool blocked = bf16_cache && hd % 32 == 0;
  int64_t capacity = G * hd > 0 ? k.data.numel() / (G * hd) : 0;
  if (capacity < need) {
    int64_t grown = std::max(need, std::min(c.block_size, 2 * capacity));
    if (blocked) grown = attention::blocked_capacity(grown);
    const int64_t kept = blocked ? capacity : pos0;  // positions' worth of each head to move
    const DType dtype = bf16_cache ? DType::bf16 : DType::f32;
    for (BasicBuffer<T>* buf : {&k, &v}) {
      Tensor fresh(dtype, {G * grown * hd});
      for (int64_t g = 0; g < G && pos0 > 0; ++g)
        std::memcpy(fresh.data<T>() + g * grown * hd, buf->ptr() + g * capacity * hd,
                    sizeof(T) * static_cast<size_t>(kept * hd));
      buf->data = std::move(fresh);
    }
    capacity = grown;
  }
  if constexpr (bf16_cache)
    if (blocked) append_blocked(qkv, d, pos0, capacity, k.ptr(), v.ptr());
  if (!blocked)
    for (int64_t g = 0; g < G; ++g) {
      append_rows(qkv + (d.H + g) * hd, d.W, d.T, hd, k.ptr() + (g * capacity + pos0) * hd);
      append_rows(qkv + (d.H + G + g) * hd, d.W, d.T, hd, v.ptr() + (g * capacity + pos0) * hd);
    }
  p.shape.len_kv = need;
  p.options.alignment = attention::Alignment::bottom_right;
  p.kv_layout = blocked ? attention::KvLayout::blocked : attention::KvLayout::rows;
  p.k = cache_operand(k.ptr(), d, capacity);
  p.v = cache_operand(v.ptr(), d, capacity);
}
template void use_cache(const GPTConfig&, const Dims&, int64_t, const float*, BasicBuffer<float>&,
                        BasicBuffer<float>&, attention::AttentionParams&);
template void use_cache(const GPTConfig&, const Dims&, int64_t, const float*, BasicBuffer<bf16>&,
                        BasicBuffer<bf16>&, attention::AttentionParams&);

}  // namespace detail

using detail::Dims;

namespace {

const float* maybe(const float* base, int64_t offset) {
  return offset >= 0 ? base + offset : nullptr;
}

}  // namespace

const float* GPT::forward(ThreadContext& ctx, const int32_t* tokens, int64_t batch, int64_t seq,
                          const ForwardOptions& options) {
  check_tokens(tokens, batch, seq, 0, options.lengths.empty());
  return run(ctx, *state_, tokens, batch, seq, 0, false, options);
}

void GPT::reset_cache() {
  state_->cache_len = 0;
}
int64_t GPT::cache_length() const {
  return state_->cache_len;
}

const float* GPT::decode(ThreadContext& ctx, const int32_t* tokens, int64_t count,
                         attention::KernelChoice kernel) {
  check_tokens(tokens, 1, count, state_->cache_len);
  ForwardOptions options;
  options.kernel = kernel;
  const float* logits = run(ctx, *state_, tokens, 1, count, state_->cache_len, true, options);
  state_->cache_len += count;
  // With an LM head, the last row's logits alone; without, every row's hidden states.
  return config_.lm_head ? logits : logits + (count - 1) * config_.output_width();
}

const float* GPT::run(ThreadContext& ctx, State& s, const int32_t* tokens, int64_t batch,
                      int64_t seq, int64_t pos0, bool cached, const ForwardOptions& options) {
  detail::ensure_tables(config_, s);
  const GPTConfig& c = config_;
  const Dims d = detail::dims(c, batch, seq);
  const ModelOffsets off = model_offsets(c, layout_);
  const float* P = params_.data();
  // bf16 products (set_dtype): each input rounded, the weights read from their bf16 copy
  // (training) or packed (inference: packed_weight).
  const bool b16 = dtype_ == DType::bf16;
  const bool inference = options.inference || cached;
  const bf16* P16 = b16 && !inference ? params16(ctx) : nullptr;
  // Where a product's input x [n] goes rounded to bf16: inference, one scratch; training, kept
  // for the backward's weight gradient (s.rounded, found there by x).
  auto rounded_slot = [&](const float* x, int64_t n) {
    Tensor* keep = &s.x16;
    if (!s.inference) {
      if (s.rounded.size() <= s.rounded_used) s.rounded.resize(s.rounded_used + 1);
      State::Rounded& r = s.rounded[s.rounded_used++];
      r.src = x;
      r.n = n;
      keep = &r.values;
    }
    if (keep->numel() < n) *keep = Tensor(DType::bf16, {n});
    return keep->data<bf16>();
  };
  // y = x·Wᵀ + b; with bf16 products x is rounded first, unless its rounded copy is given (x16:
  // written there by its producer, x itself left unwritten).
  // With y16 (bf16 products only), y is written only rounded, there (y itself left unwritten).
  auto linear = [&](const ops::LinearShape& sh, const float* x, int64_t ldx, int64_t w_off,
                    const float* bias, float* y, int64_t ldy,
                    std::optional<ops::Activation> act = std::nullopt, const bf16* x16 = nullptr,
                    bf16* y16 = nullptr) {
    if (!b16) return ops::linear_forward(ctx, sh, x, ldx, P + w_off, bias, y, ldy, act);
    if (!x16) {
      bf16* slot = rounded_slot(x, sh.rows * sh.in_features);
      ctx.parallel_for(sh.rows, [&](Range rows, int) {
        for (int64_t r = rows.begin; r < rows.end; ++r)
          to_bf16(x + r * ldx, slot + r * sh.in_features, static_cast<size_t>(sh.in_features));
      });
      x16 = slot;
    }
    const ops::PackedWeight* packed =
        inference ? &packed_weight(ctx, w_off, sh.in_features, sh.out_features) : nullptr;
    if (packed && !packed->serves(sh.rows)) packed = nullptr;
    const bf16* w16 = packed ? nullptr : (P16 ? P16 : params16(ctx)) + w_off;
    if (y16) {
      check(!act, "linear: a bf16-only output with an activation");
      if (packed)
        return ops::linear_forward_bf16_rounded(ctx, sh, x16, sh.in_features, *packed, bias, y16,
                                                ldy);
      return ops::linear_forward_bf16_rounded(ctx, sh, x16, sh.in_features, w16, bias, y16, ldy);
    }
    if (packed)
      return ops::linear_forward_bf16(ctx, sh, x16, sh.in_features, *packed, bias, y, ldy, act);
    ops::linear_forward_bf16(ctx, sh, x16, sh.in_features, w16, bias, y, ldy, act);
  };
  const bool drop = options.train && c.dropout > 0.0f;
  const ops::NormKind nk =
      c.norm == Norm::layernorm ? ops::NormKind::layer_norm : ops::NormKind::rms_norm;
  const ops::NormShape ns{.kind = nk, .rows = d.rows, .cols = d.C, .eps = c.norm_eps};
  // A pre-norm block's norm, whose output only feeds a product: with bf16 products it is written
  // only rounded, into the rounded slot its float32 buffer y names (y stays unwritten). Returns
  // the rounded rows, or null when y holds the output.
  auto norm_into_product = [&](const float* x, int64_t w_off, const float* bias, float* y,
                               float* mean, float* rstd) -> const bf16* {
    if (!b16) {
      ops::norm_forward(ctx, ns, x, P + w_off, bias, y, mean, rstd);
      return nullptr;
    }
    bf16* y16 = rounded_slot(y, d.rows * d.C);
    ops::norm_forward_bf16(ctx, ns, x, P + w_off, bias, y16, mean, rstd);
    return y16;
  };
  s.batch = batch;
  s.seq = seq;
  s.rounded_used = 0;
  detail::set_segments(c, batch, seq, cached, options, s);
  s.inference = inference;
  s.micro_batch = false;
  s.cached = cached;
  s.x.resize(static_cast<size_t>(c.n_layer + 1));
  s.blocks.resize(static_cast<size_t>(c.n_layer));

  float* x0 = s.x[0].get(d.rows * d.C);
  float* emb = c.embedding_norm ? s.emb.get(d.rows * d.C) : x0;  // the summed embeddings
  const float* pos = c.positional == Positional::learned      ? P + off.wpe + pos0 * d.C
                     : c.positional == Positional::sinusoidal ? s.sinusoidal.data() + pos0 * d.C
                                                              : nullptr;
  if (cached && s.cache_k.empty()) {
    s.cache_k.resize(static_cast<size_t>(c.n_layer));
    s.cache_v.resize(static_cast<size_t>(c.n_layer));
    s.cache_k16.resize(static_cast<size_t>(c.n_layer));
    s.cache_v16.resize(static_cast<size_t>(c.n_layer));
  }
  ops::embedding_forward(ctx,
                         {.rows = d.rows,
                          .dim = d.C,
                          .vocab = d.V,
                          .period = d.T,
                          .positions = s.positions.empty() ? nullptr : s.positions.data()},
                         tokens, P + off.wte, pos, emb);
  if (c.type_vocab_size > 0) {
    s.types.assign(static_cast<size_t>(d.rows), 0);
    if (options.token_types) s.types.assign(options.token_types, options.token_types + d.rows);
    detail::add_type_embeddings(ctx, c, d, s.types.data(), P + off.wtt, emb);
  }
  if (c.embedding_norm)
    ops::norm_forward(ctx, ns, emb, P + off.lne_w, maybe(P, off.lne_b), x0, s.lne_mean.get(d.rows),
                      s.lne_rstd.get(d.rows));
  if (drop) detail::dropout(ctx, x0, d.rows * d.C, c.dropout, options.seed, 0);

  float* branch = s.dres.get(d.rows * d.C);  // a residual branch's output before it is added
  // An inference forward keeps nothing for a backward: the blocks share one set of buffers and
  // the residual stream alternates between two, so its memory does not grow with the depth; only
  // each layer's q/k/v rows stay (GPT::head_attention reads them after the forward).
  const bool share = s.inference;
  auto stream_at = [&](int64_t i) -> Buffer& {
    return s.x[static_cast<size_t>(share && i > 0 ? 1 + (i - 1) % 2 : i)];
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const Dims d = detail::dims(c, batch, seq, l);  // this layer's head counts
    BlockActivations& a = s.blocks[static_cast<size_t>(share ? 0 : l)];
    const BlockOffsets& o = off.blocks[static_cast<size_t>(l)];
    const float* x = stream_at(l).ptr();
    float* out = stream_at(l + 1).get(d.rows * d.C);
    const uint64_t stream = 1 + 2 * static_cast<uint64_t>(l);

    // Attention branch.
    const float* a_in = x;
    const bf16* a_in16 = nullptr;
    if (c.norm_first) {
      a_in = a.ln1.get(d.rows * d.C);
      a_in16 = norm_into_product(x, o.ln1_w, maybe(P, o.ln1_b), a.ln1.ptr(), a.ln1_mean.get(d.rows),
                                 a.ln1_rstd.get(d.rows));
    }
    float* qkv = s.blocks[static_cast<size_t>(l)].qkv.get(d.rows * d.W);
    // bf16 products, sequences of kBf16AttentionRows or more: attention on qkv rounded to bf16
    // (kept for the backward). Shorter ones keep fp32 attention: there the bf16 kernels' per-call
    // costs (packing pair words, whole 16-row tiles) outweigh their faster products, the
    // backward's first. Decoding in bf16 always: the KV cache is kept in bf16 (half the memory and
    // the bytes each step reads). Without RoPE (which turns the float32 rows) and outside decoding
    // (whose cache takes float32 rows), the product writes qkv only rounded: `qkv` then only
    // names the rows (detail::to_bf16_operands) and is never written or read.
    const bool attend16 = b16 && (cached || detail::bf16_attention(s));
    bf16* qkv16 = nullptr;
    if (attend16) {
      Tensor& t = s.blocks[static_cast<size_t>(l)].qkv16;
      if (t.numel() < d.rows * d.W) t = Tensor(DType::bf16, {d.rows * d.W});
      qkv16 = t.data<bf16>();
    }
    const bool rounded_only = attend16 && !cached && c.positional != Positional::rope;
    s.attended_bf16 = attend16;
    linear({.rows = d.rows, .in_features = d.C, .out_features = d.W}, a_in, d.C, o.attn_w,
           maybe(P, o.attn_b), qkv, d.W, std::nullopt, a_in16, rounded_only ? qkv16 : nullptr);
    if (c.positional == Positional::rope)
      for (const Segment& g : s.segments) {
        float* q = qkv + g.row0 * d.W;
        apply_rope(s.rope, {g.batch * g.len, g.len, pos0, d.W, d.H, false}, q);
        apply_rope(s.rope, {g.batch * g.len, g.len, pos0, d.W, d.G, false}, q + d.H * d.hd);
      }
    float* att = a.att.get(d.rows * d.H * d.hd);
    float* lse = a.lse.get(d.rows * d.H);
    if (attend16 && !rounded_only) to_bf16(ctx, qkv, qkv16, d.rows * d.W);
    for (size_t i = 0; i < s.segments.size(); ++i) {
      const Segment& g = s.segments[i];
      attention::AttentionParams p = detail::segment_attention(c, d, g, l, qkv, att, lse, s);
      if (qkv16) detail::to_bf16_operands(qkv, qkv16, p);
      if (cached && qkv16)
        detail::use_cache(c, d, pos0, qkv, s.cache_k16[static_cast<size_t>(l)],
                          s.cache_v16[static_cast<size_t>(l)], p);
      else if (cached)
        detail::use_cache(c, d, pos0, qkv, s.cache_k[static_cast<size_t>(l)],
                          s.cache_v[static_cast<size_t>(l)], p);
      if (options.attention_probs)
        p.probs = options.attention_probs + l * d.B * c.n_head * d.T * d.T;
      const int64_t stats = l * d.B * c.n_head * d.T;  // this layer's [B, n_head, T]
      if (options.attention_entropy) p.entropy = options.attention_entropy + stats;
      if (options.attention_argmax) p.argmax = options.attention_argmax + stats;
      if (options.attention_max_weight) p.max_weight = options.attention_max_weight + stats;
      if (drop) {
        p.options.dropout_p = c.dropout;
        p.options.dropout_seed = detail::attention_dropout_seed(options.seed, l, i);
      }
      detail::layer_attention(ctx, c, l, p, options.kernel, false);
    }
    a.gated = !gates_.ones(l);
    const float* attg = att;
    if (a.gated) {
      float* gated = a.attg.get(d.rows * d.H * d.hd);
      gates_.forward(ctx, l, {.rows = d.rows, .heads = d.H, .head_dim = d.hd}, att, gated);
      attg = gated;
    }
    linear({.rows = d.rows, .in_features = d.H * d.hd, .out_features = d.C}, attg, d.H * d.hd,
           o.proj_w, maybe(P, o.proj_b), branch, d.C);
    if (drop) detail::dropout(ctx, branch, d.rows * d.C, c.dropout, options.seed, stream);
    float* h = a.h.get(d.rows * d.C);
    detail::add(ctx, d.rows * d.C, x, branch, h);

    // MLP branch.
    const float* m_in;
    const bf16* m_in16 = nullptr;  // pre-norm with bf16 products: ln_2's rows, rounded
    if (c.norm_first) {
      m_in = a.ln2.get(d.rows * d.C);
      m_in16 = norm_into_product(h, o.ln2_w, maybe(P, o.ln2_b), a.ln2.ptr(), a.ln2_mean.get(d.rows),
                                 a.ln2_rstd.get(d.rows));
    } else {
      ops::norm_forward(ctx, ns, h, P + o.ln1_w, maybe(P, o.ln1_b), a.ln1.get(d.rows * d.C),
                        a.ln1_mean.get(d.rows), a.ln1_rstd.get(d.rows));
      m_in = a.ln1.ptr();
    }
    float* fc = a.fc.get(d.rows * d.Fi);
    float* gel = a.gel.get(d.rows * d.F);
    const ops::LinearShape up{.rows = d.rows, .in_features = d.C, .out_features = d.Fi},
        down{.rows = d.rows, .in_features = d.F, .out_features = d.C};
    const ops::ActivationShape as{.kind = c.activation, .rows = d.rows, .width = d.F};
    // For a backward, GELU's derivative replaces fc (which nothing else reads), from the same
    // tanh or erf as its value.
    const bool keep_grad = !s.inference && ops::activation_keeps_grad(c.activation);
    if (keep_grad && b16) {  // (training: P16 is the bf16 arena)
      // Mixed precision: the value is only written rounded to bf16, where the down product and
      // the backward's weight gradient read it (gel itself stays unwritten: it names the copy).
      linear(up, m_in, d.C, o.fc_w, maybe(P, o.fc_b), fc, d.Fi, std::nullopt, m_in16);
      bf16* gel16 = rounded_slot(gel, d.rows * d.F);
      ops::activation_forward_keeping_grad_bf16(ctx, as, fc, gel16);
      ops::linear_forward_bf16(ctx, down, gel16, d.F, P16 + o.fc_proj_w, maybe(P, o.fc_proj_b),
                               branch, d.C);
    } else {
      if (s.inference && c.activation != ops::Activation::swiglu) {
        linear({.rows = d.rows, .in_features = d.C, .out_features = d.F}, m_in, d.C, o.fc_w,
               maybe(P, o.fc_b), gel, d.F, c.activation, m_in16);
      } else {
        linear(up, m_in, d.C, o.fc_w, maybe(P, o.fc_b), fc, d.Fi, std::nullopt, m_in16);
        if (keep_grad)
          ops::activation_forward_keeping_grad(ctx, as, fc, gel);
        else
          ops::activation_forward(ctx, as, fc, gel);
      }
      linear(down, gel, d.F, o.fc_proj_w, maybe(P, o.fc_proj_b), branch, d.C);
    }
    if (drop) detail::dropout(ctx, branch, d.rows * d.C, c.dropout, options.seed, stream + 1);
    if (c.norm_first) {
      detail::add(ctx, d.rows * d.C, h, branch, out);
    } else {
      float* h2 = a.h2.get(d.rows * d.C);
      detail::add(ctx, d.rows * d.C, m_in, branch, h2);
      ops::norm_forward(ctx, ns, h2, P + o.ln2_w, maybe(P, o.ln2_b), out, a.ln2_mean.get(d.rows),
                        a.ln2_rstd.get(d.rows));
    }
  }

  const float* final_in = stream_at(c.n_layer).ptr();
  if (c.norm_first) {
    ops::norm_forward(ctx, ns, final_in, P + off.lnf_w, maybe(P, off.lnf_b),
                      s.lnf.get(d.rows * d.C), s.lnf_mean.get(d.rows), s.lnf_rstd.get(d.rows));
    final_in = s.lnf.ptr();
  }
  if (!c.lm_head) return final_in;
  if (!options.logits) {
    check(options.inference, "logits: a forward without logits must be for inference");
    return final_in;
  }
  // Decoding needs the next token's logits only: those of the last row.
  const int64_t out_rows = cached ? 1 : d.rows;
  float* logits = s.logits.get(out_rows * d.V);
  linear({.rows = out_rows, .in_features = d.C, .out_features = d.V},
         final_in + (d.rows - out_rows) * d.C, d.C, off.lm_head, nullptr, logits, d.V);
  return logits;
}

void GPT::set_dtype(DType dtype) {
  check(dtype == DType::f32 || dtype == DType::bf16, "dtype: must be float32 or bfloat16, got {}",
        dtype_name(dtype));
  if (dtype != dtype_) state_->cache_len = 0;  // the cache is kept in the products' dtype
  dtype_ = dtype;
  params16_stale_ = packed_stale_ = true;
  if (dtype == DType::f32) {
    params16_ = Tensor();
    packed_.clear();
  }
}

const ops::PackedWeight& GPT::packed_weight(ThreadContext& ctx, int64_t offset, int64_t in_features,
                                            int64_t out_features) {
  if (packed_stale_) {
    packed_.clear();
    packed_store_.clear();
    packed_stale_ = false;
  }
  ops::PackedWeight& w = packed_[offset];
  if (w.in_features() != in_features || w.out_features() != out_features) {
    Tensor rounded(DType::bf16, {out_features * in_features});  // [out, in], as the arena holds it
    to_bf16(ctx, params_.data() + offset, rounded.data<bf16>(), out_features * in_features);
    w = ops::PackedWeight(rounded.data<bf16>(), in_features, out_features, &packed_store_);
  }
  return w;
}

const bf16* GPT::params16(ThreadContext& ctx) {
  const int64_t n = params_.numel();
  if (params16_stale_ || params16_.numel() != n) {
    if (params16_.numel() != n) params16_ = Tensor(DType::bf16, {n});
    to_bf16(ctx, params_.data(), params16_.data<bf16>(), n);
    params16_stale_ = false;
  }
  return params16_.data<bf16>();
}

void GPT::head_attention(ThreadContext& ctx, int64_t layer, int64_t head, float* probs,
                         attention::KernelChoice kernel) {
  State& s = *state_;
  const GPTConfig& c = config_;
  check(!s.blocks.empty() && s.batch == 1 && s.segments.size() == 1 && !s.cached,
        "head_attention: needs a forward of one sequence first (not packed, not decoding)");
  check(layer >= 0 && layer < c.n_layer && head >= 0 && head < c.heads(layer),
        "head_attention: ({}, {}) is not a head of this model ({} layers, {} heads in that layer)",
        layer, head, c.n_layer, layer >= 0 && layer < c.n_layer ? c.heads(layer) : 0);
  const Dims d = detail::dims(c, 1, s.seq, layer);
  int64_t kv = 0, first = 0;  // the key/value head `head` reads
  for (const int64_t n : c.group_sizes(layer)) {
    if (head < first + n) break;
    first += n;
    ++kv;
  }
  std::vector<float> out(static_cast<size_t>(d.T * d.hd));  // [T, hd], not needed
  BlockActivations& a = s.blocks[static_cast<size_t>(layer)];
  attention::AttentionParams p = detail::attention_params(
      c, d, a.qkv.ptr(), out.data(), nullptr, s.alibi.empty() ? nullptr : s.alibi.data() + head);
  // The rows the forward attended: bf16 when it attended in bf16 (qkv itself may be unwritten).
  if (s.attended_bf16) detail::to_bf16_operands(a.qkv.ptr(), a.qkv16.data<bf16>(), p);
  p.shape.heads = 1;
  p.shape.kv_heads = 1;
  for (auto [o, at] : {std::pair{&p.q, head}, std::pair{&p.k, kv}, std::pair{&p.v, kv}}) {
    if (o->bf16)
      o->bf16 += at * d.hd;
    else
      o->data += at * d.hd;
  }
  p.out = {.data = out.data(), .batch_stride = d.T * d.hd, .head_stride = d.hd, .row_stride = d.hd};
  p.lse = nullptr;
  p.probs = probs;
  attention::forward(ctx, p, kernel);
}

double GPT::loss(ThreadContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                 int64_t seq, const ForwardOptions& options) {
  check(config_.lm_head, "loss: the model has no LM head (an encoder's hidden states)");
  const float* logits = forward(ctx, tokens, batch, seq, options);
  return ops::cross_entropy(ctx, {batch * seq, config_.vocab_size}, logits, targets, nullptr);
}

}  // namespace headlight::model

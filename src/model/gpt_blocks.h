// Helpers shared by the GPT's forward, backward and decoding: sizes, attention operands over the
// packed c_attn rows, dropout and the positional tables.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "headlight/attention/dispatch.h"
#include "headlight/attention/params.h"
#include "headlight/core/bf16.h"
#include "headlight/core/thread_context.h"
#include "headlight/model/config.h"
#include "src/model/gpt_state.h"

namespace headlight::model::detail {

struct Dims {
  int64_t B, T, rows, C, H, G, hd, W, F, Fi, V;  // Fi: c_fc's output width (2F for SwiGLU)
};
// Sizes of layer `layer` (its head counts after any pruning).
inline Dims dims(const GPTConfig& c, int64_t batch, int64_t seq, int64_t layer = 0) {
  return {.B = batch,
          .T = seq,
          .rows = batch * seq,
          .C = c.n_embd,
          .H = c.heads(layer),
          .G = c.kv_heads(layer),
          .hd = c.head_dim(),
          .W = c.qkv_width(layer),
          .F = c.mlp_width(),
          .Fi = c.fc_width(),
          .V = c.vocab_size};
}

// Attention over the packed rows qkv [B, T, (H + 2G)·hd] into att [B, T, H·hd] with lse [B, H, T]:
// the operands are strided views, no copies. Causality, ALiBi and dropout from the config.
attention::AttentionParams attention_params(const GPTConfig& c, const Dims& d, float* qkv,
                                            float* att, float* lse, const float* alibi);
// Points dout/dq/dk/dv of p at datt [rows, H·hd] and dqkv [rows, (H + 2G)·hd].
void set_attention_grads(const Dims& d, float* datt, float* dqkv, attention::AttentionParams& p);

// Runs a layer's attention p (forward, or backward when `backward`): one call when the layer's
// key/value groups are equal, else one call per key/value head over its own query heads (a pruned
// grouped-query layer, GPTConfig::layer_groups), each on sub-views of the same buffers; lse,
// probabilities and row statistics are then group-major ([B, heads of group 0, T], [B, heads of
// group 1, T], …: the same layout when B = 1).
void layer_attention(ThreadContext& ctx, const GPTConfig& c, int64_t layer,
                     const attention::AttentionParams& p, attention::KernelChoice kernel,
                     bool backward);

// x[i] ← keep_i ? x[i] / (1 − p) : 0 with keep_i = U(seed, stream, i) ≥ p. The backward of
// dropout is the same call on the gradient.
void dropout(ThreadContext& ctx, float* x, int64_t n, float p, uint64_t seed, uint64_t stream);

// out[i] = a[i] + b[i] (out may alias a or b).
void add(ThreadContext& ctx, int64_t n, const float* a, const float* b, float* out);

// x[rows, C] += wtt[types[r], :] (token-type embeddings); throws naming token_types on a type
// outside [0, type_vocab_size).
void add_type_embeddings(ThreadContext& ctx, const GPTConfig& c, const Dims& d,
                         const int32_t* types, const float* wtt, float* x);

// The seed of layer l's attention-probability dropout for a step seed (and a packed sequence).
uint64_t attention_dropout_seed(uint64_t seed, int64_t layer, size_t segment = 0);
// The step seed of micro-batch `part` of a step in micro-batches (its dropout streams).
uint64_t micro_batch_seed(uint64_t seed, int64_t part);

// The segments (and, for packed sequences, the row positions) of a forward into s; throws naming
// `lengths` when they do not fit.
void set_segments(const GPTConfig& c, int64_t batch, int64_t seq, bool cached,
                  const ForwardOptions& o, GPT::State& s);

// Attention of one segment's rows (layer `layer`'s head counts) within the layer's packed
// qkv [rows, W], att [rows, H·hd] and lse ([B, H, T] per segment, from row0·H).
attention::AttentionParams segment_attention(const GPTConfig& c, const Dims& d, const Segment& g,
                                             int64_t layer, float* qkv, float* att, float* lse,
                                             const GPT::State& s);

// bf16 products: attention in bf16 too when every segment has at least this many rows. The bf16
// kernels' forward is faster from 32 rows up (SmolLM2's 9 heads over 3, D = 64, causal: 0.072
// against 0.12 ms at 128, 0.40 against 1.23 at 512), their backward from 128 (the training
// benchmark's 16 × 4 heads, D = 32: 1.0 against 1.35 ms at 128; 0.27 against 0.19 at 32).
constexpr int64_t kBf16AttentionRows = 128;
bool bf16_attention(const GPT::State& s);

// Operands that point into the float32 `rows`, pointed instead at the same elements of the bf16
// `rows16` (data null).
void point_at_bf16(const float* rows, const bf16* rows16,
                   std::initializer_list<attention::Operand*> operands);
// bf16 attention: q, k and v of p, which point into `qkv`, pointed instead at the same elements
// of `qkv16` (qkv rounded to bf16).
void to_bf16_operands(const float* qkv, const bf16* qkv16, attention::AttentionParams& p);

// Appends the d.T rows' keys and values (in qkv; one sequence at positions pos0…) to one layer's
// cache [G, capacity, hd] (float32, or rounded to bf16; grown as needed, up to block_size
// positions) and points p's k and v at the whole cache (bottom-right aligned). A bf16 cache with
// hd a multiple of 32 is kept in the blocked layout instead (attention/kv_layout.h: G regions of
// capacity positions, capacity whole chunks of 256), which decode reads in place.
template <class T>
void use_cache(const GPTConfig& c, const Dims& d, int64_t pos0, const float* qkv, BasicBuffer<T>& k,
               BasicBuffer<T>& v, attention::AttentionParams& p);

// Fills the sinusoidal, rotary and ALiBi tables of the state once.
void ensure_tables(const GPTConfig& c, GPT::State& s);

}  // namespace headlight::model::detail

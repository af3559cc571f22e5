// GPT: a GPT-style decoder (or, with causal = false, a bidirectional encoder) on headlight's fused
// attention. Forward and a hand-written backward for every layer, llm.c style: parameters and
// gradients are two arenas with one layout (ParameterLayout), activations are kept from the
// forward for the backward. Conventions (names, scale, norms, positions) as docs/design.md §2.
//
// Block, pre-norm (norm_first):  h = x + attn(ln_1(x));  out = h + mlp(ln_2(h));  logits =
//   ln_f(x_L) · lm_headᵀ.  Post-norm:  h = ln_1(x + attn(x));  out = ln_2(h + mlp(h)).
// attn(x) = c_proj(concat_h gate_h · softmax(q_h k_gᵀ/√d + bias) v_g) with q, k, v the rows of
// c_attn(x); mlp(x) = c_proj(gelu(c_fc(x))). Dropout (training only) on the embeddings, the
// attention probabilities and both residual branches, from a counter-based RNG keyed by the seed.
//
// Per-head gates (attention/head_gates.h, default 1) scale each head's output before c_proj; their
// gradients are what the head-importance score of Michel et al. needs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "headlight/attention/dispatch.h"
#include "headlight/attention/head_gates.h"
#include "headlight/core/bf16.h"
#include "headlight/core/tensor.h"
#include "headlight/core/tensor_source.h"
#include "headlight/core/thread_context.h"
#include "headlight/model/config.h"
#include "headlight/model/parameters.h"
#include "headlight/ops/matmul.h"

namespace headlight::model {

struct ForwardOptions {
  bool train = false;  // dropout on (when config.dropout > 0)
  uint64_t seed = 0;   // dropout stream for this step
  attention::KernelChoice kernel = attention::KernelChoice::automatic;
  // When non-null: the exact attention probabilities P of every layer (after dropout when train is
  // set and the config has dropout),
  // [n_layer, B, n_head, T, T], recomputed by the fused kernel from the saved log-sum-exp.
  float* attention_probs = nullptr;
  // When non-null: per-row statistics of every layer's and head's attention (before dropout),
  // [n_layer, B, n_head, T] each: the entropy (nats), the most attended key and its weight
  // (attention/params.h). Computed inside the fused kernel: no [T, T] matrix is stored.
  float* attention_entropy = nullptr;
  int64_t* attention_argmax = nullptr;
  float* attention_max_weight = nullptr;
  // No backward follows (embeddings, generation, capture): the MLP's activation runs in its
  // product's epilogue, the layers share one set of activation buffers (only each layer's q/k/v
  // rows are kept, for head_attention), so memory does not grow with the depth; backward() after
  // such a forward is an error. Decoding with the KV cache is always so.
  bool inference = false;
  // Token types (segments) [B, T] for a model with type_vocab_size > 0; null: all 0.
  const int32_t* token_types = nullptr;
  // Packed sequences: tokens [1, Σ lengths] hold independent sequences of these lengths, each
  // from position 0 and attending only within itself (no padding anywhere). Empty: one [B, T]
  // batch. Not with the KV cache or attention_probs.
  std::vector<int64_t> lengths{};
  // false: stop after the final norm and return the hidden states [B, T, n_embd] even when the
  // model has an LM head (what a capture of the attention needs: the logits' product, a fifth of
  // a small model's forward, is skipped). No backward follows such a forward.
  bool logits = true;
  // Backward: false computes the gates' gradients (and the activations' on the way) but not the
  // linear layers' and embeddings' weight gradients — two thirds of a backward's products — for
  // head importance. (Norm weights still get theirs.)
  bool weight_grads = true;
  // Backward: false skips the heads' gates' gradients (training does not read them); where a
  // layer's gates are not all 1 they still scale the output gradient.
  bool gate_grads = true;
  // forward_backward: the batch's sequences in this many equal micro-batches, each forward and
  // backward whole on one thread when their count is a multiple of the thread count (so that its
  // activations never cross between cores), their weight gradients added in micro-batch order. 0:
  // chosen from the shape, never from the thread count (kMicroBatchRows; 1 when the step does not
  // qualify), so the bits are the same for any thread count; 1: the whole batch at once. More than
  // 1 needs a step that qualifies (micro_batches_for): the weights' gradients without the gates'
  // (gate_grads false, every gate 1), no probabilities or statistics, no packed sequences.
  int64_t micro_batches = 0;
};

// The automatic choice of ForwardOptions::micro_batches: halving the batch while each part keeps at
// least this many rows (tokens), up to kMaxMicroBatches parts whose extra gradient arenas (one a
// part after the first) take at most kMicroBatchArenaBytes.
constexpr int64_t kMicroBatchRows = 1024;
constexpr int64_t kMaxMicroBatches = 8;
constexpr int64_t kMicroBatchArenaBytes = int64_t{256} << 20;

class GPT {
 public:
  // A new model with nanoGPT's initialisation: weights N(0, 0.02), the residual projections
  // (c_proj) N(0, 0.02/√(2·n_layer)), biases 0, norm weights 1; from a Generator seeded by `seed`.
  GPT(const GPTConfig& config, uint64_t seed);
  // A model with the weights of `source`: its config from the metadata entry "headlight.config",
  // every tensor of the layout present with its shape, and no other tensor. Throws Error naming the
  // tensor otherwise.
  explicit GPT(const TensorSource& source);
  // A model of `config` with the weights of `source`, named as the layout names them (the loaders
  // of other formats hand over a source that renames and reshapes their tensors).
  GPT(const GPTConfig& config, const TensorSource& source);
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;
  GPT(GPT&&) noexcept;
  GPT& operator=(GPT&&) noexcept;
  ~GPT();

  const GPTConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  // Mutable access marks the bf16 copy of the weights (set_dtype) stale; it is remade before the
  // next forward that uses it.
  float* params() {
    params16_stale_ = packed_stale_ = true;
    return params_.data();
  }
  const float* params() const { return params_.data(); }
  // The gradients' arena, made (zeroed) on first use: a model only run forward never holds it.
  float* grads() { return grads_arena().data(); }
  const float* grads() const { return grads_arena().data(); }
  // The parameter `name` (a view into the arena); throws naming it when absent.
  float* param(const std::string& name) {
    params16_stale_ = packed_stale_ = true;
    return params_.data() + layout_.at(name).offset;
  }
  float* grad(const std::string& name) { return grads() + layout_.at(name).offset; }

  // [n_layer, n_head] gates and their gradients (accumulated by forward_backward).
  attention::HeadGates& gates() { return gates_; }
  const attention::HeadGates& gates() const { return gates_; }
  // Zeroes the parameter and gate gradients.
  void zero_grads();

  // logits [B, T, vocab] for tokens [B, T] (1 ≤ T ≤ block_size), or without an LM head
  // (config.lm_head false) the final hidden states [B, T, n_embd]; valid until the next call.
  const float* forward(ThreadContext& ctx, const int32_t* tokens, int64_t batch, int64_t seq,
                       const ForwardOptions& options = {});
  // The forward, the mean cross-entropy against targets [B, T] (−1 ignores a position), and the
  // backward: gradients are added into grads() and gates().grads(). Returns the loss. In
  // micro-batches (ForwardOptions::micro_batches) backward() cannot follow it.
  double forward_backward(ThreadContext& ctx, const int32_t* tokens, const int32_t* targets,
                          int64_t batch, int64_t seq, const ForwardOptions& options = {});
  // The backward of the last forward from the gradient of its output (doutput, the shape forward
  // returned): gradients are added into grads() and gates().grads(). `tokens` and `options` must
  // be the forward's.
  void backward(ThreadContext& ctx, const int32_t* tokens, const float* doutput,
                const ForwardOptions& options = {});
  // The micro-batches forward_backward runs this step in (options.micro_batches resolved; throws
  // naming it when it cannot be honoured).
  int64_t micro_batches_for(int64_t batch, int64_t seq, const ForwardOptions& options) const;
  // The mean cross-entropy alone (no gradients).
  double loss(ThreadContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
              int64_t seq, const ForwardOptions& options = {});

  // Incremental decoding with a KV cache (batch of one). Keys and values of every layer are kept
  // for up to block_size positions; decode() appends `count` tokens at the cache's end and returns
  // the output of the last one ([output_width], valid until the next call). reset_cache() empties
  // it.
  void reset_cache();
  int64_t cache_length() const;
  const float* decode(ThreadContext& ctx, const int32_t* tokens, int64_t count,
                      attention::KernelChoice kernel = attention::KernelChoice::automatic);

  // The exact attention P [T, T] of one head after a forward of one sequence (batch 1, not
  // packed, not decoding), recomputed from the queries and keys that forward saved: one head's
  // share of the layer's attention, so that a long context's chosen heads can be seen without
  // every head's [T, T] matrix (ForwardOptions::attention_probs). Throws naming what is missing.
  void head_attention(ThreadContext& ctx, int64_t layer, int64_t head, float* probs,
                      attention::KernelChoice kernel = attention::KernelChoice::automatic);

  // The dtype of the dense products, forward and backward: float32, or bf16 — mixed precision:
  // weights rounded to bf16 (a copy beside the float32 parameters, which stay the master that
  // AdamW updates), each product's inputs (activations, output gradients) rounded, products
  // accumulated in fp32 into float32 activations and gradients; norms, softmax, residuals and the
  // loss stay float32. Attention reads q, k, v in bf16 for sequences of ≥ 128 rows and when
  // decoding, whose KV cache is then kept in bf16 (a change of dtype empties the cache). An
  // inference forward (decoding included) reads each product's weight packed once for oneDNN
  // (ops::PackedWeight) instead of the bf16 copy of the arena, which only training makes.
  void set_dtype(DType dtype);
  DType dtype() const { return dtype_; }

  struct State;  // activations, KV cache and tables (src/model/gpt_state.h)

 private:
  // one_sequence: the rows are sequences, each within block_size (false: packed sequences,
  // whose lengths are checked with them).
  void check_tokens(const int32_t* tokens, int64_t batch, int64_t seq, int64_t offset,
                    bool one_sequence = true) const;
  // The forward over tokens [B, T] at positions pos0…; with `cached`, keys and values go into the
  // KV cache and attention reads the whole cache (batch of one).
  const float* run(ThreadContext& ctx, State& s, const int32_t* tokens, int64_t batch, int64_t seq,
                   int64_t pos0, bool cached, const ForwardOptions& options);
  // The backward of the forward held in s, its gradients added into G (an arena of the layout).
  void backward_into(ThreadContext& ctx, State& s, float* G, const int32_t* tokens,
                     const float* doutput, const ForwardOptions& options);

  GPTConfig config_;
  ParameterLayout layout_;
  // The bf16 copy of the parameter arena for bf16 products (set_dtype), remade when stale (in
  // place, in parallel: after every optimizer step in training).
  const bf16* params16(ThreadContext& ctx);

  Tensor params_;  // [layout.total()], the arena of every parameter
  DType dtype_ = DType::f32;
  Tensor params16_;  // [layout.total()] bf16, when dtype_ is bf16
  bool params16_stale_ = true;
  // bf16 inference: a product's weight [out, in] at `offset` in the arena, rounded to bf16 and
  // packed for oneDNN on first use (one decoding step's products read them in a third to a half
  // of the time a plain bf16 weight takes), then kept until the parameters change.
  const ops::PackedWeight& packed_weight(ThreadContext& ctx, int64_t offset, int64_t in_features,
                                         int64_t out_features);
  ops::PackedWeightStore packed_store_;                    // (declared first: it outlives packed_)
  std::unordered_map<int64_t, ops::PackedWeight> packed_;  // by offset, in packed_store_
  bool packed_stale_ = true;
  Tensor& grads_arena() const;  // grads_, zeroed on first use
  // [layout.total()], their gradients; empty until a backward or an accessor needs them (made in
  // const accessors too: the gradients of a model that has run no backward read as zeros).
  mutable Tensor grads_;
  attention::HeadGates gates_;
  std::unique_ptr<State> state_;  // (also the first micro-batch's)
  // Micro-batches after the first: their activations and their gradient arenas (zero between
  // steps: the step that adds one into grads_ zeroes it).
  std::vector<std::unique_ptr<State>> part_states_;
  std::vector<Tensor> part_grads_;
};

}  // namespace headlight::model

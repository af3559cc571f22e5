// MultiheadAttention: torch.nn.MultiheadAttention's semantics, parameter names and shapes, with a
// grouped-query extension (num_kv_heads), per-head gates, and a hand-written backward.
//
//   q = query·W_qᵀ + b_q    k = key·W_kᵀ + b_k    v = value·W_vᵀ + b_v      (W_k, W_v: [H_kv·d, ·])
//   [add_bias_kv: append bias_k / bias_v as one more key/value row]
//   [add_zero_attn: append a zero key/value row]
//   head_h = attention(q_h, k_g, v_g) with g = h / (H / H_kv), scale 1/√d, masks merged
//   out = concat_h(gate_h · head_h)·W_oᵀ + b_o
//
// Layouts: (L, N, E) inputs, or (N, L, E) with batch_first, or unbatched (L, E). attn_mask is
// (L, S) or (N·H, L, S); key_padding_mask is (N, S) (or (S) unbatched); a bool mask is True where
// attention is NOT allowed (PyTorch's MultiheadAttention convention), a float mask is added.
// is_causal applies the causal mask when no attn_mask is given (PyTorch raises there; with a mask,
// as in PyTorch, it is only a hint and the mask is used). A query row with no allowed key outputs
// zeros (PyTorch: NaN).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "headlight/attention/dispatch.h"
#include "headlight/attention/head_gates.h"
#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention {

struct MultiheadAttentionConfig {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  float dropout = 0.0f;
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  int64_t kdim = 0;  // 0: embed_dim
  int64_t vdim = 0;  // 0: embed_dim
  bool batch_first = false;
  int64_t num_kv_heads = 0;                       // 0: num_heads
  KernelChoice kernel = KernelChoice::automatic;  // the attention kernel (dispatch.h)
};

struct MhaForwardOptions {
  TensorView key_padding_mask{};  // empty: none
  bool need_weights = true;
  TensorView attn_mask{};  // empty: none
  bool average_attn_weights = true;
  bool is_causal = false;
};

struct MhaOutput {
  Tensor output;
  Tensor weights;  // undefined unless need_weights
};

struct MhaInputGrads {
  Tensor query, key, value;
};

class MultiheadAttention {
 public:
  // Validates the config (naming the offending argument) and initialises the parameters as PyTorch
  // does (Xavier-uniform projections, zero biases), from `seed`.
  explicit MultiheadAttention(const MultiheadAttentionConfig& config, uint64_t seed = 0);
  ~MultiheadAttention();
  MultiheadAttention(MultiheadAttention&&) noexcept;
  MultiheadAttention& operator=(MultiheadAttention&&) noexcept;

  const MultiheadAttentionConfig& config() const { return config_; }
  int64_t head_dim() const { return config_.embed_dim / config_.num_heads; }
  bool packed_in_proj() const;  // in_proj_weight (kdim = vdim = embed_dim) or q/k/v_proj_weight

  // Dropout on the attention weights applies only in training mode (the default, as in PyTorch).
  bool training() const { return training_; }
  void set_training(bool training) { training_ = training; }
  // Each training-mode forward uses this seed for its dropout mask and then advances it.
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }

  // Parameters in PyTorch's state_dict order and names.
  const std::vector<std::string>& parameter_names() const { return names_; }
  Tensor& parameter(const std::string& name);
  const Tensor& parameter(const std::string& name) const;
  std::map<std::string, Tensor> state_dict() const;  // copies
  // Loads every parameter; throws naming the key on a missing, unexpected or wrongly shaped entry.
  void load_state_dict(const std::map<std::string, TensorView>& state);

  // Per-head output multipliers (head_gates.h: one layer of num_heads), 1 by default; their
  // gradient after backward() (overwritten, like the parameters').
  HeadGates& head_gates() { return gates_; }
  const HeadGates& head_gates() const { return gates_; }

  MhaOutput forward(ThreadContext& ctx, const TensorView& query, const TensorView& key,
                    const TensorView& value, const MhaForwardOptions& options = {});
  // Gradients of the inputs for the last forward; the parameter gradients (overwritten, not
  // accumulated) are then in grad(name), keyed like state_dict().
  MhaInputGrads backward(ThreadContext& ctx, const TensorView& grad_output);
  const Tensor& grad(const std::string& name) const;

 private:
  struct Cache;
  // The steps of forward (multihead_attention.cc).
  bool check_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                    Cache& k) const;
  void project(ThreadContext& ctx, Cache& k) const;
  void merge_masks(const MhaForwardOptions& options, bool batched, Cache& k) const;

  MultiheadAttentionConfig config_;
  std::vector<std::string> names_;
  std::map<std::string, Tensor> params_;
  std::map<std::string, Tensor> grads_;
  HeadGates gates_;
  bool training_ = true;
  uint64_t dropout_seed_ = 0;
  std::unique_ptr<Cache> cache_;
};

}  // namespace headlight::attention

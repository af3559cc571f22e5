// scaled_dot_product_attention with the semantics of PyTorch 2.x's
// torch.nn.functional.scaled_dot_product_attention, on TensorViews of any rank.
//
// Shapes: query (..., L, E), key (..., S, E), value (..., S, Ev) → output (..., L, Ev). Dim −3 is
// the head dim (absent for 2-D inputs); the dims before it are batch dims and broadcast. Key/value
// heads equal the query heads, or are 1 (shared by all), or, with enable_gqa, divide them.
// attn_mask broadcasts to (..., L, S): bool is True where attention is allowed, float is added.
// is_causal is the top-left aligned lower triangle. The one deliberate difference from PyTorch:
// a query row with no allowed key outputs zeros, not NaN.
//
// Query, key and value are all float32 or all bfloat16; the output has their dtype. bfloat16
// attention computes in fp32 with the probabilities rounded to bf16 for P·V (docs/design.md); a
// float mask may be float32 or bfloat16. The backward returns gradients in the inputs' dtype
// (computed in fp32, rounded once).
#pragma once

#include <cstdint>
#include <optional>

#include "headlight/attention/dispatch.h"
#include "headlight/attention/params.h"
#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention {

struct SdpaOptions {
  TensorView attn_mask{};  // empty view: no mask; bool, float32 or bfloat16
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  bool is_causal = false;
  std::optional<float> scale{};
  bool enable_gqa = false;
  KernelChoice kernel = KernelChoice::automatic;
};

struct SdpaGrads {
  Tensor query, key, value;  // shaped like the inputs
};

Tensor scaled_dot_product_attention(ThreadContext& ctx, const TensorView& query,
                                    const TensorView& key, const TensorView& value,
                                    const SdpaOptions& options = {});

// The output with each row's log-sum-exp of its scaled, masked scores (float32, natural log,
// shaped as the output without its last dim): what the backward needs from the forward, so that
// a caller that keeps both (an autograd graph) spares the backward recomputing them.
// With `probs`, also the exact attention probabilities from the same fused pass (after dropout,
// as the output used them).
struct SdpaOutput {
  Tensor output;  // (..., L, Ev), the inputs' dtype
  Tensor lse;     // (..., L) float32
  Tensor probs;   // (..., L, S) float32, when asked for
};
SdpaOutput scaled_dot_product_attention_with_lse(ThreadContext& ctx, const TensorView& query,
                                                 const TensorView& key, const TensorView& value,
                                                 const SdpaOptions& options = {},
                                                 bool probs = false);

// A forward's output and log-sum-exp (scaled_dot_product_attention_with_lse, same inputs and
// options, dropout seed included) for the backward; empty views: recomputed.
struct SdpaSaved {
  TensorView output;
  TensorView lse;
};

SdpaGrads scaled_dot_product_attention_backward(ThreadContext& ctx, const TensorView& query,
                                                const TensorView& key, const TensorView& value,
                                                const TensorView& grad_output,
                                                const SdpaOptions& options = {},
                                                const SdpaSaved& saved = {});

}  // namespace headlight::attention

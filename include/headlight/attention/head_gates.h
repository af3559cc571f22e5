// Per-head gates: a scalar ξ_h on each attention head's output before the output projection (1 by
// default), as Michel et al. (2019, "Are Sixteen Heads Really Better than One?") put on heads to
// score their importance. Their gradient is that score's ingredient, and a gate at 0 computes what
// the model with the head pruned computes. One set of gates per attention layer: MultiheadAttention
// has one layer, the GPT one per block. Gates are not parameters: no checkpoint holds them.
//
// For the rows x[rows, H·d] of one layer (head h owns columns h·d … h·d + d − 1):
//   forward   out[r, h·d + e]    = ξ_h · x[r, h·d + e]
//   backward  dξ_h              += Σ_r Σ_e dout[r, h·d + e] · x[r, h·d + e]   (double, rows in
//   order)
//             dx[r, h·d + e]     = ξ_h · dout[r, h·d + e]                     (dx may alias dout)
// A layer may hold fewer heads than the gates have columns (a pruned layer): its heads are the
// first H of the row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention {

// The rows a layer's gates act on: [rows, heads · head_dim], contiguous.
struct GatedRows {
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
};

class HeadGates {
 public:
  HeadGates() = default;
  // Gates [layers, heads], all 1; gradients 0.
  HeadGates(int64_t layers, int64_t heads);

  int64_t layers() const { return layers_; }
  int64_t heads() const { return heads_; }
  int64_t size() const { return layers_ * heads_; }
  float* values() { return values_.data(); }  // [layers, heads]
  const float* values() const { return values_.data(); }
  const float* grads() const { return grads_.data(); }  // [layers, heads]
  float& at(int64_t layer, int64_t head) { return values()[layer * heads_ + head]; }
  float at(int64_t layer, int64_t head) const { return values()[layer * heads_ + head]; }
  // Copies of the values, to change some gates and put them back.
  std::vector<float> snapshot() const;
  void restore(std::span<const float> values);
  void zero_grads();

  // Whether every gate of layer `layer` is exactly 1 (the forward is then a copy to skip).
  bool ones(int64_t layer) const;
  // out = ξ ⊙ x for layer `layer` (out may alias x).
  void forward(ThreadContext& ctx, int64_t layer, const GatedRows& shape, const float* x,
               float* out) const;
  // Adds dξ of layer `layer` into grads() and writes dx (which may alias dout).
  void backward(ThreadContext& ctx, int64_t layer, const GatedRows& shape, const float* x,
                const float* dout, float* dx);

 private:
  int64_t layers_ = 0, heads_ = 0;
  Tensor values_, grads_;
};

}  // namespace headlight::attention

// AdamW with PyTorch's semantics, gradient-norm clipping and the warmup + cosine learning-rate
// schedule, all over the model's parameter arena (one loop each, llm.c style).
#pragma once

#include <cstdint>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"
#include "headlight/model/parameters.h"

namespace headlight::train {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; only on entries with decay (matrices of linear layers)
};

// torch.optim.AdamW, step t (from 1):
//   p ← p − lr·wd·p                 (decaying entries only)
//   m ← β1·m + (1 − β1)·g,  v ← β2·v + (1 − β2)·g²
//   p ← p − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + eps)
class AdamW {
 public:
  AdamW(const model::ParameterLayout& layout, const AdamWConfig& config);
  // Elementwise, split over the context's threads.
  void step(ThreadContext& ctx, float* params, const float* grads, float lr);
  int64_t steps() const { return steps_; }
  const AdamWConfig& config() const { return config_; }
  // The moments, [layout.total()] each, for checkpoints.
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  AdamWConfig config_;
  std::vector<uint8_t> decay_;  // [total] 1 where weight decay applies
  Tensor m_, v_;
  int64_t steps_ = 0;
};

// torch.nn.utils.clip_grad_norm_: the L2 norm of all gradients (returned, before clipping); when
// it exceeds max_norm the gradients are scaled by max_norm / (norm + 1e-6). max_norm ≤ 0: no clip.
// The sum of squares goes through fixed chunks in order: the same bits for any thread count.
double clip_grad_norm(ThreadContext& ctx, float* grads, int64_t n, double max_norm);

// nanoGPT's schedule: linear warmup lr·(step + 1)/(warmup + 1) for step < warmup, then a cosine
// from lr down to min_lr at step total, min_lr after.
struct LrSchedule {
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup = 0;
  int64_t total = 1;
  float at(int64_t step) const;
};

}  // namespace headlight::train

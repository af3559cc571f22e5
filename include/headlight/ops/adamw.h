// The AdamW update of every parameter (train::AdamW keeps the moments and the step count; this is
// its elementwise pass, SIMD through Highway with dynamic dispatch).
#pragma once

#include <cstdint>

#include "headlight/core/thread_context.h"

namespace headlight::ops {

// One step's operands and constants: the moments m, v [n] are updated in place, and params [n]
//     p ← (decay[i] ? p · decay_factor : p) − step_size · m / (√v / bc2_sqrt + eps)
// with m ← β1·m + (1 − β1)·g and v ← β2·v + (1 − β2)·g·g (torch.optim.AdamW's update, in float:
// each operation rounded as the scalar expression in this order rounds it, so the vector and
// scalar paths give the same bits).
struct AdamWUpdate {
  float* params = nullptr;
  const float* grads = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const uint8_t* decay = nullptr;  // [n] 1 where weight decay applies
  int64_t n = 0;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float step_size = 0.0f;     // lr / (1 − β1^t)
  float decay_factor = 1.0f;  // 1 − lr · weight_decay
  float bc2_sqrt = 1.0f;      // √(1 − β2^t)
};

// Runs the update over [0, n), split over the context's threads.
void adamw_update(ThreadContext& ctx, const AdamWUpdate& u);

}  // namespace headlight::ops

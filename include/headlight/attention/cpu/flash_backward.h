// The fused (flash-style) attention backward on the CPU: the gradients of reference::backward,
// recomputing the probabilities tile by tile from Q, K and the log-sum-exp saved by the forward,
// with no floating-point atomics: bitwise the same for any thread count.
#pragma once

#include "headlight/attention/params.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention::cpu {

// Reads p.q, p.k, p.v, the forward's p.out and p.lse, and p.dout; writes p.dq, p.dk and p.dv
// (overwriting them).
void flash_backward(ThreadContext& ctx, const AttentionParams& p);

}  // namespace headlight::attention::cpu

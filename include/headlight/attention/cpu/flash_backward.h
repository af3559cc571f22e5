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

// Whether flash_backward_bf16 runs here: bf16 inputs, and AMX tiles or AVX-512 BF16 usable
// (core/cpu_info.h).
bool bf16_backward_available(const AttentionParams& p);

// The backward of bf16 attention on AMX tiles, else on vdpbf16ps (flash_backward_bf16.cc): the
// same reads and writes, gradients computed from bf16 products with fp32 accumulation and written
// rounded once into bf16 gradient operands (or exactly into fp32 ones). Needs
// bf16_backward_available(p).
void flash_backward_bf16(ThreadContext& ctx, const AttentionParams& p);

}  // namespace headlight::attention::cpu

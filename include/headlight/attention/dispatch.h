// Which attention kernel runs: the fused SIMD kernels by default, the reference on request.
//
// The environment variable HEADLIGHT_KERNEL=reference|fused (read at each call) forces a path for
// every call that leaves the choice on `automatic`; an explicit choice in the API wins over it.
#pragma once

#include <string_view>

#include "headlight/attention/params.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention {

enum class KernelChoice { automatic, reference, fused };

// "reference" / "fused" / "automatic"; throws naming `what` on anything else.
KernelChoice parse_kernel_choice(std::string_view name, std::string_view what);

// The kernel `choice` resolves to (automatic: HEADLIGHT_KERNEL if set, else fused).
KernelChoice resolve_kernel(KernelChoice choice);

// The forward with the chosen kernel. With the fused kernel, probabilities (p.probs) are recomputed
// from the saved log-sum-exp by cpu::probabilities after the forward.
void forward(ThreadContext& ctx, const AttentionParams& p,
             KernelChoice choice = KernelChoice::automatic);

// The backward with the chosen kernel. The fused backward uses p.out and p.lse from the forward
// when both are given, and recomputes them otherwise. With bf16 inputs the fused path runs on
// AMX tiles or AVX-512 BF16 where the CPU has them (cpu::flash_backward_bf16), else the fp32
// kernel on widened copies; either way the gradients are rounded once into bf16 gradient operands.
void backward(ThreadContext& ctx, const AttentionParams& p,
              KernelChoice choice = KernelChoice::automatic);

}  // namespace headlight::attention

// The fused (flash-style) attention forward on the CPU: the same contract as reference::forward
// (params.h gives the formulas), computed tile by tile with the online softmax, never materialising
// the L_q × L_kv score matrix, with SIMD inner loops chosen at run time (Highway).
#pragma once

#include <string>

#include "headlight/attention/params.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention::cpu {

// Writes p.out and p.lse (when non-null). p.probs must be null: exact probabilities come from the
// saved log-sum-exp, not from the forward.
void flash_forward(ThreadContext& ctx, const AttentionParams& p);

// The SIMD target the fused kernels dispatch to on this machine ("AVX3", "AVX2", …).
std::string flash_target();

}  // namespace headlight::attention::cpu

// The fused (flash-style) attention forward on the CPU: the same contract as reference::forward
// (params.h gives the formulas), computed tile by tile with the online softmax, never materialising
// the L_q × L_kv score matrix, with SIMD inner loops chosen at run time (Highway).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headlight/attention/params.h"
#include "headlight/core/thread_context.h"

namespace headlight::attention::cpu {

// Writes p.out and p.lse (when non-null). p.probs must be null: exact probabilities come from the
// saved log-sum-exp, not from the forward.
void flash_forward(ThreadContext& ctx, const AttentionParams& p);

// Which probabilities to recompute: a subset of query heads and a range of query rows.
struct ProbabilitiesRequest {
  std::vector<int64_t> heads;  // query heads, in the order wanted; empty: all heads
  int64_t row_begin = 0;
  int64_t row_end = -1;  // −1: len_q
};

// Exact attention probabilities P' (after dropout, as the forward used them), recomputed tile by
// tile as exp(s − lse) from p.q, p.k, the options and the log-sum-exp p.lse saved by a forward:
// out [batch, heads.size(), row_end − row_begin, len_kv], contiguous. Costs a Q·Kᵀ and an exp per
// score of the requested rows only: no Lq × Lk pass beyond what is asked for.
void probabilities(ThreadContext& ctx, const AttentionParams& p,
                   const ProbabilitiesRequest& request, float* out);

// The SIMD target the fused kernels dispatch to on this machine ("AVX3", "AVX2", …).
std::string flash_target();

}  // namespace headlight::attention::cpu

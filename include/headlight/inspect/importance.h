// Head importance over a dataset, and pruning.
//
// Gradient importance (Michel et al., 2019, "Are Sixteen Heads Really Better than One?"): with a
// gate ξ_h on each head's output, I_h = E_x |ξ_h · ∂L(x)/∂ξ_h|, the expectation over the dataset's
// sequences (one sequence at a time, so that the absolute value is taken per example), then
// normalised per layer by the L2 norm of that layer's scores. With every gate at 1 (the default)
// this is Michel's score; a head already gated off (ξ = 0) scores 0.
// Ablation importance: L(dataset with ξ_h = 0) − L(dataset), one head at a time.
//
// Pruning removes heads physically: their rows of c_attn's q (and, for multi-head attention, k and
// v) and their columns of c_proj. The smaller model computes what the original computes with those
// heads' gates at 0.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"

namespace headlight::inspect {

// Sequences of `seq` tokens for importance and loss evaluation: consecutive windows of `data`.
struct Dataset {
  std::vector<int32_t> tokens, targets;  // [count, seq] each
  int64_t count = 0, seq = 0;
};
// Up to max_sequences consecutive windows of seq inputs with the model's training objective
// (train/objective.h; encoders' masks drawn from a fixed seed).
Dataset make_dataset(std::span<const int32_t> data, const model::GPTConfig& c, int64_t seq,
                     int64_t max_sequences);

// Mean loss over the dataset with the model's current gates.
double dataset_loss(ThreadContext& ctx, model::GPT& m, const Dataset& d, int64_t batch = 8);

// [n_layer × n_head] scores (zeros for heads a pruned layer lacks).
std::vector<double> gradient_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d);
std::vector<double> ablation_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d);

using HeadId = std::pair<int64_t, int64_t>;  // (layer, head), counted from 0

// A new model without `heads` (throws naming the head when it does not exist; multi-head models
// only, n_kv_head = n_head: removing a query head of a grouped-query model would unbalance its
// group). Gates of the kept heads carry over.
model::GPT prune_heads(const model::GPT& m, const std::vector<HeadId>& heads);

// The `count` heads to remove first: the lowest scores (ties: lower layer, then head), or a seeded
// random choice when scores is empty.
std::vector<HeadId> heads_to_remove(const model::GPTConfig& c, const std::vector<double>& scores,
                                    int64_t count, uint64_t seed);

}  // namespace headlight::inspect

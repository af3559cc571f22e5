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
#include "headlight/load/model.h"
#include "headlight/model/gpt.h"

namespace headlight::inspect {

// What importance is scored on and pruning judged by. Two kinds:
//   windows (a model with an LM head): `count` sequences of `seq` tokens, consecutive windows of
//     a text, with the model's training objective's targets; measured by the mean cross-entropy
//     (its exp is the perplexity);
//   sentences (an encoder without an LM head, seq = 0): `count` sentences packed end to end in
//     `tokens` with their `lengths`, measured by 1 − the mean cosine of their pooled embeddings
//     to `reference` [count, n_embd], those of the unpruned model.
struct Dataset {
  std::vector<int32_t> tokens, targets;  // windows: [count, seq] each; sentences: no targets
  int64_t count = 0, seq = 0;
  std::vector<int64_t> lengths{};  // sentences: [count]
  load::Pooling pooling{};
  std::vector<float> reference{};  // sentences: [count, n_embd]
  bool sentences() const { return !lengths.empty(); }
  // What dataset_loss measures: "loss" (cross-entropy, nats) or "1 − cosine".
  const char* measure() const { return sentences() ? "1 − cosine" : "loss"; }
};
// Up to max_sequences consecutive windows of seq inputs with the model's training objective
// (train/objective.h; encoders' masks drawn from a fixed seed).
Dataset make_dataset(std::span<const int32_t> data, const model::GPTConfig& c, int64_t seq,
                     int64_t max_sequences);

// Sentences (each a list of token ids, special tokens included) for an encoder with `pooling`: the
// reference embeddings are the model's own with its current gates.
Dataset make_sentence_dataset(ThreadContext& ctx, model::GPT& m,
                              const std::vector<std::vector<int32_t>>& sentences,
                              const load::Pooling& pooling);

// With the model's current gates: windows, the mean loss; sentences, 1 − the mean cosine of the
// embeddings to the reference ones.
double dataset_loss(ThreadContext& ctx, model::GPT& m, const Dataset& d, int64_t batch = 8);

// [n_layer × n_head] scores (zeros for heads a pruned layer lacks), normalised per layer by their
// L2 norm.
//   windows: Michel et al.'s E_x |ξ_h ∂L(x)/∂ξ_h| on the LM loss;
//   sentences: the judging measure 1 − cos(ê(ξ), ê(1)) is flat at ξ = 1, so its first-order
//     term is zero; its second-order term for removing head h is ½‖P⊥ ∂ê/∂ξ_h‖², with ê the
//     unit embedding and P⊥ the projection orthogonal to it. The score is E_x ‖ξ_h ∂ê/∂ξ_h‖²,
//     estimated per sentence with one random probe r ~ N(0, I): E_r (r · ξ_h ∂ê/∂ξ_h)² =
//     ‖ξ_h ∂ê/∂ξ_h‖² (Hutchinson's trick), one backward per sentence for every head at once.
std::vector<double> gradient_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d);
std::vector<double> ablation_importance(ThreadContext& ctx, model::GPT& m, const Dataset& d);

using HeadId = std::pair<int64_t, int64_t>;  // (layer, head), counted from 0

// A new model without `heads` (throws naming the head when it does not exist). Multi-head
// attention: each removed head takes its key and value rows along. Grouped-query attention: the
// query head's rows go; its key/value head stays while another query head of its group remains,
// and goes with the last one, so a layer's groups may become unequal (GPTConfig::layer_groups,
// each group then attends in its own call). Gates of the kept heads carry over.
model::GPT prune_heads(const model::GPT& m, const std::vector<HeadId>& heads);

// The `count` heads to remove first: the lowest scores (ties: lower layer, then head), or a seeded
// random choice when scores is empty.
std::vector<HeadId> heads_to_remove(const model::GPTConfig& c, const std::vector<double>& scores,
                                    int64_t count, uint64_t seed);

}  // namespace headlight::inspect

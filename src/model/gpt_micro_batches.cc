// GPT::forward_backward: a training step's forward, loss and backward, over the whole batch or in
// micro-batches.
//
// In micro-batches the batch's sequences are cut into P equal parts. Each part runs its forward,
// its share of the loss (the mean's divisor is the whole batch's count of targets) and its
// backward on one thread from start to end (ThreadContext::parallel_parts, when P is a multiple
// of the thread count), its weight gradients going into an arena of its own (the first part's into
// grads()); then the arenas are added into grads() in part order. Nothing a part writes is read by
// another core until that sum, so on a virtual machine whose two vCPUs sit on different core
// complexes (a core reads a line the other has just written 3× slower there, and the passes over
// just-written activations of a step on both threads took 3–4× as long) the step keeps its speed.
// Each part's dropout draws from its own seed (micro_batch_seed). P comes from the shape (and
// the model's size), never from the thread count, so a step's bits are the same for any thread
// count; they differ from the whole batch's by the order of the weight gradients' sums.

#include <algorithm>
#include <string>

#include "headlight/core/error.h"
#include "headlight/model/gpt.h"
#include "headlight/ops/layers.h"
#include "src/model/gpt_blocks.h"
#include "src/model/gpt_state.h"

namespace headlight::model {

int64_t GPT::micro_batches_for(int64_t batch, int64_t seq, const ForwardOptions& o) const {
  check(o.micro_batches >= 0, "micro_batches: must be ≥ 0, got {}", o.micro_batches);
  bool gates_ones = true;
  for (int64_t l = 0; l < config_.n_layer; ++l) gates_ones = gates_ones && gates_.ones(l);
  // Why this step cannot run in micro-batches (empty: it can).
  std::string why;
  if (!config_.lm_head)
    why = "no LM head";
  else if (o.gate_grads)
    why = "the gates' gradients (gate_grads)";
  else if (!gates_ones)
    why = "gates other than 1";
  else if (!o.weight_grads)
    why = "no weight gradients (weight_grads false)";
  else if (o.attention_probs || o.attention_entropy || o.attention_argmax || o.attention_max_weight)
    why = "attention probabilities or statistics";
  else if (!o.lengths.empty())
    why = "packed sequences (lengths)";
  else if (o.inference || !o.logits)
    why = "an inference forward";
  if (o.micro_batches == 0) {
    if (!why.empty() || batch <= 0 || seq <= 0) return 1;
    const int64_t arena = layout_.total() * int64_t{sizeof(float)};
    int64_t parts = 1;
    while (2 * parts <= kMaxMicroBatches && batch % (2 * parts) == 0 &&
           batch * seq / (2 * parts) >= kMicroBatchRows &&
           (2 * parts - 1) * arena <= kMicroBatchArenaBytes)
      parts *= 2;
    return parts;
  }
  if (o.micro_batches == 1) return 1;
  check(why.empty(), "micro_batches: a step with {} cannot run in micro-batches (got {})", why,
        o.micro_batches);
  check(batch % o.micro_batches == 0, "micro_batches: {} does not divide the batch of {} sequences",
        o.micro_batches, batch);
  return o.micro_batches;
}

double GPT::forward_backward(ThreadContext& ctx, const int32_t* tokens, const int32_t* targets,
                             int64_t batch, int64_t seq, const ForwardOptions& options) {
  check(config_.lm_head,
        "forward_backward: the model has no LM head (an encoder's hidden states); use backward() "
        "with a gradient of the hidden states");
  const int64_t V = config_.vocab_size;
  const int64_t parts = micro_batches_for(batch, seq, options);
  if (parts == 1) {
    forward(ctx, tokens, batch, seq, options);
    State& s = *state_;
    float* dlogits = s.dlogits.get(batch * seq * V);
    const double loss = ops::cross_entropy(ctx, {batch * seq, V}, s.logits.ptr(), targets, dlogits);
    backward(ctx, tokens, dlogits, options);
    return loss;
  }
  check_tokens(tokens, batch, seq, 0);
  const int64_t rows = batch * seq, part_batch = batch / parts, part_rows = part_batch * seq;
  const int64_t counted = ops::counted_targets(rows, V, targets);
  // What the parts share, made here on every thread: the gradient arenas, the parameters' bf16
  // copy, the parts' states.
  const int64_t n = layout_.total();
  float* G = grads();
  if (dtype_ == DType::bf16) params16(ctx);
  while (static_cast<int64_t>(part_states_.size()) < parts - 1)
    part_states_.push_back(std::make_unique<State>());
  if (static_cast<int64_t>(part_grads_.size()) < parts - 1)
    part_grads_.resize(static_cast<size_t>(parts - 1));
  for (int64_t i = 0; i < parts - 1; ++i)
    if (part_grads_[static_cast<size_t>(i)].numel() != n)
      part_grads_[static_cast<size_t>(i)] = Tensor::zeros({n});
  std::vector<double> losses(static_cast<size_t>(parts), 0.0);
  auto run_part = [&](int64_t i, ThreadContext& pc) {
    State& s = i == 0 ? *state_ : *part_states_[static_cast<size_t>(i - 1)];
    float* g = i == 0 ? G : part_grads_[static_cast<size_t>(i - 1)].data();
    ForwardOptions o = options;
    o.seed = detail::micro_batch_seed(options.seed, i);
    if (options.token_types) o.token_types = options.token_types + i * part_rows;
    const int32_t* t = tokens + i * part_rows;
    run(pc, s, t, part_batch, seq, 0, false, o);
    float* dlogits = s.dlogits.get(part_rows * V);
    losses[static_cast<size_t>(i)] =
        ops::cross_entropy(pc, {.rows = part_rows, .vocab = V, .counted = counted}, s.logits.ptr(),
                           targets + i * part_rows, dlogits);
    backward_into(pc, s, g, t, dlogits, o);
    s.micro_batch = true;
  };
  try {
    ctx.parallel_parts(parts, run_part);
  } catch (...) {  // (a part that failed may have added some of its gradients: start at zero again)
    for (int64_t i = 0; i < parts - 1; ++i) part_grads_[static_cast<size_t>(i)].fill(0.0f);
    throw;
  }
  // grads() += the other parts' gradients, in part order; each arena left zero for the next step.
  ctx.parallel_for(n, [&](Range r, int) {
    for (int64_t i = 0; i < parts - 1; ++i) {
      float* part = part_grads_[static_cast<size_t>(i)].data();
      for (int64_t j = r.begin; j < r.end; ++j) G[j] += part[j];
      std::fill(part + r.begin, part + r.end, 0.0f);
    }
  });
  double loss = 0.0;
  for (const double l : losses) loss += l;
  return loss;
}

}  // namespace headlight::model

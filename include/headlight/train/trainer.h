// The training loop: batches drawn from a token stream by a seeded counter (so a run is the same
// for any thread count and resumes exactly), AdamW with warmup + cosine, gradient clipping,
// periodic evaluation, checkpoints (model + optimizer state for --resume) and a JSONL metrics log.
// Decoders learn the next token, encoders masked tokens (train/objective.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"
#include "headlight/model/tokenizer.h"
#include "headlight/train/objective.h"
#include "headlight/train/optimizer.h"

namespace headlight::train {

struct TrainOptions {
  int64_t steps = 1500;
  int64_t batch = 16;
  int64_t seq = 0;  // tokens per row; 0: the model's block_size
  LrSchedule schedule{.lr = 2e-3f, .min_lr = 2e-4f, .warmup = 100, .total = 1500};
  AdamWConfig adam{};
  float grad_clip = 1.0f;  // ≤ 0: off
  // Micro-batches per step (model::ForwardOptions::micro_batches): 0 chosen from the shape, 1 the
  // whole batch at once, n > 1 must divide batch.
  int64_t micro_batches = 0;
  int64_t eval_every = 250;
  int64_t eval_batches = 8;
  int64_t log_every = 10;        // metrics log lines
  int64_t checkpoint_every = 0;  // 0: at each evaluation; the final checkpoint is always written
  uint64_t seed = 1337;
  float mask_fraction = kMaskFraction;  // encoders only
  std::string out{};                    // model checkpoint path ("" writes none)
  std::string metrics{};                // JSONL path ("" writes none)
  bool resume = false;                  // continue from out's optimizer state
};

// Throws Error naming the option when inconsistent with the model or the data.
void validate(const TrainOptions& o, const model::GPTConfig& c);

struct StepReport {
  int64_t step = 0;  // steps done
  int64_t steps = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_second = 0.0;
  double elapsed = 0.0;  // seconds since the start of this run
  double eta = 0.0;      // seconds left, estimated
  std::optional<double> val_loss{};
};

struct TrainResult {
  int64_t steps = 0;
  double train_loss = 0.0;  // mean over the last log_every steps
  double val_loss = 0.0;
  double seconds = 0.0;
  double tokens_per_second = 0.0;
};

// One batch [batch, seq] of inputs and targets for `step`: rows start at offsets drawn from
// (seed, step); encoders get masked inputs.
struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(std::span<const int32_t> data, const model::GPTConfig& c, int64_t batch,
                 int64_t seq, uint64_t seed, int64_t step, float mask_fraction);

// The mean loss over up to max_batches batches of consecutive windows from the start of `data`.
double evaluate(ThreadContext& ctx, model::GPT& m, std::span<const int32_t> data, int64_t batch,
                int64_t seq, int64_t max_batches, float mask_fraction = kMaskFraction);

TrainResult train_model(ThreadContext& ctx, model::GPT& m, const model::Tokenizer* tokenizer,
                        std::span<const int32_t> train_data, std::span<const int32_t> val_data,
                        const TrainOptions& o,
                        const std::function<void(const StepReport&)>& on_step = {});

}  // namespace headlight::train

// The training loop (see headlight/train/trainer.h).

#include "headlight/train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/io/safetensors.h"
#include "headlight/train/checkpoint.h"
#include "headlight/train/objective.h"

namespace headlight::train {

namespace {

uint64_t mix(uint64_t seed, uint64_t a, uint64_t b) {
  const auto k = philox4x32(seed, a, b);
  return (static_cast<uint64_t>(k[0]) << 32) | k[1];
}

void save_optimizer(const std::string& path, AdamW& opt, int64_t step, uint64_t seed) {
  const Shape shape{opt.m().numel()};
  const std::vector<io::TensorToWrite> tensors = {{"adamw.m", shape, opt.m().data()},
                                                  {"adamw.v", shape, opt.v().data()}};
  io::write_safetensors(
      path, tensors,
      {{"headlight.step", std::to_string(step)}, {"headlight.seed", std::to_string(seed)}});
}

int64_t load_optimizer(const std::string& path, AdamW& opt) {
  const io::SafetensorsFile f(path);
  const Shape want{opt.m().numel()};
  for (const char* name : {"adamw.m", "adamw.v"}) {
    check(f.contains(name) && f.shape(name) == want,
          "{}: optimizer state \"{}\" is missing or does not fit the model ({} floats)", path, name,
          want[0]);
  }
  f.read_f32("adamw.m", opt.m().data());
  f.read_f32("adamw.v", opt.v().data());
  const auto step = f.metadata("headlight.step");
  check(step.has_value(), "{}: metadata \"headlight.step\" is missing", path);
  const int64_t s = std::stoll(*step);
  opt.set_steps(s);
  return s;
}

// One line of the JSONL metrics log.
void log_step(std::ofstream& metrics, const StepReport& r) {
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens_per_second", r.tokens_per_second},
                      {"elapsed", r.elapsed}};
  if (r.val_loss) {
    j["val_loss"] = *r.val_loss;
    j["val_perplexity"] = std::exp(*r.val_loss);
  }
  metrics << j.dump() << "\n" << std::flush;
}

}  // namespace

void validate(const TrainOptions& o, const model::GPTConfig& c) {
  check(o.steps > 0, "steps: must be positive, got {}", o.steps);
  check(o.batch > 0, "batch: must be positive, got {}", o.batch);
  check(o.seq >= 0 && o.seq <= c.block_size, "seq: must be in [1, block_size {}], got {}",
        c.block_size, o.seq);
  check(o.eval_every > 0 && o.eval_batches > 0 && o.log_every > 0,
        "eval_every, eval_batches and log_every must be positive");
  check(o.schedule.lr > 0 && o.schedule.min_lr >= 0 && o.schedule.warmup >= 0,
        "lr: the schedule needs lr > 0, min_lr ≥ 0 and warmup ≥ 0");
  check(c.causal || (o.mask_fraction > 0 && o.mask_fraction < 1),
        "mask_fraction: must be in (0, 1) for an encoder, got {}", o.mask_fraction);
  check(!o.resume || !o.out.empty(), "resume: needs the checkpoint path (out)");
  check(o.micro_batches >= 0, "micro_batches: must be ≥ 0, got {}", o.micro_batches);
  check(o.micro_batches <= 1 || o.batch % o.micro_batches == 0,
        "micro_batches: {} does not divide the batch of {} sequences", o.micro_batches, o.batch);
}

Batch make_batch(std::span<const int32_t> data, const model::GPTConfig& c, int64_t batch,
                 int64_t seq, uint64_t seed, int64_t step, float mask_fraction) {
  const Objective objective = Objective::of(c, mask_fraction);
  const int64_t need = objective.span(seq);
  check(static_cast<int64_t>(data.size()) >= need,
        "data: {} tokens are fewer than one window of {}", data.size(), need);
  Batch b;
  b.tokens.resize(static_cast<size_t>(batch * seq));
  b.targets.resize(b.tokens.size());
  Generator g(mix(seed, 0xBA7C, static_cast<uint64_t>(step)));
  const uint64_t choices = static_cast<uint64_t>(data.size()) - static_cast<uint64_t>(need) + 1;
  for (int64_t r = 0; r < batch; ++r) {
    const uint64_t start = ((static_cast<uint64_t>(g.next_u32()) << 32) | g.next_u32()) % choices;
    objective.fill(data.data() + start, seq, g, b.tokens.data() + r * seq,
                   b.targets.data() + r * seq);
  }
  return b;
}

double evaluate(ThreadContext& ctx, model::GPT& m, std::span<const int32_t> data, int64_t batch,
                int64_t seq, int64_t max_batches, float mask_fraction) {
  const Objective objective = Objective::of(m.config(), mask_fraction);
  const int64_t windows = objective.windows(static_cast<int64_t>(data.size()), seq);
  check(windows > 0, "validation data: {} tokens are fewer than one window of {}", data.size(),
        objective.span(seq));
  double total = 0.0;
  int64_t batches = 0;
  for (int64_t w0 = 0; w0 < windows && batches < max_batches; w0 += batch, ++batches) {
    const int64_t rows = std::min(batch, windows - w0);
    std::vector<int32_t> x(static_cast<size_t>(rows * seq)), y(x.size());
    Generator g(mix(0xE7A1, static_cast<uint64_t>(batches), 0));
    for (int64_t r = 0; r < rows; ++r)
      objective.fill(data.data() + (w0 + r) * seq, seq, g, x.data() + r * seq, y.data() + r * seq);
    total += m.loss(ctx, x.data(), y.data(), rows, seq);
  }
  return total / static_cast<double>(batches);
}

TrainResult train_model(ThreadContext& ctx, model::GPT& m, const model::Tokenizer* tokenizer,
                        std::span<const int32_t> train_data, std::span<const int32_t> val_data,
                        const TrainOptions& o,
                        const std::function<void(const StepReport&)>& on_step) {
  const model::GPTConfig& c = m.config();
  validate(o, c);
  const int64_t seq = o.seq > 0 ? o.seq : c.block_size;
  AdamW opt(m.layout(), o.adam);
  int64_t step = 0;
  if (o.resume) step = load_optimizer(optimizer_path(o.out), opt);
  std::ofstream metrics;
  if (!o.metrics.empty()) {
    metrics.open(o.metrics, o.resume ? std::ios::app : std::ios::trunc);
    check(metrics.good(), "metrics: cannot open {} for writing", o.metrics);
  }
  auto checkpoint = [&](int64_t at) {
    if (o.out.empty()) return;
    save_model(o.out, m, tokenizer, {{"headlight.step", std::to_string(at)}});
    save_optimizer(optimizer_path(o.out), opt, at, o.seed);
  };
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const int64_t first = step;
  TrainResult result;
  double recent = 0.0;
  int64_t recent_n = 0;
  while (step < o.steps) {
    const Batch b = make_batch(train_data, c, o.batch, seq, o.seed, step, o.mask_fraction);
    model::ForwardOptions fo;
    fo.train = true;
    fo.gate_grads = false;  // the gates are not trained
    fo.micro_batches = o.micro_batches;
    fo.seed = mix(o.seed, 0xD809, static_cast<uint64_t>(step));
    m.zero_grads();
    const double loss =
        m.forward_backward(ctx, b.tokens.data(), b.targets.data(), o.batch, seq, fo);
    const double norm = clip_grad_norm(ctx, m.grads(), m.layout().total(), o.grad_clip);
    const float lr = o.schedule.at(step);
    opt.step(ctx, m.params(), m.grads(), lr);
    ++step;
    recent += loss;
    ++recent_n;
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    StepReport r{
        .step = step,
        .steps = o.steps,
        .loss = loss,
        .lr = lr,
        .grad_norm = norm,
        .tokens_per_second = static_cast<double>((step - first) * o.batch * seq) / elapsed,
        .elapsed = elapsed,
        .eta = elapsed / static_cast<double>(step - first) * static_cast<double>(o.steps - step)};
    const bool eval_now = step % o.eval_every == 0 || step == o.steps;
    if (eval_now && !val_data.empty()) {
      r.val_loss = evaluate(ctx, m, val_data, o.batch, seq, o.eval_batches, o.mask_fraction);
      result.val_loss = *r.val_loss;
    }
    const bool log_now = step % o.log_every == 0 || eval_now;
    if (log_now) {
      result.train_loss = recent / static_cast<double>(recent_n);
      recent = 0.0;
      recent_n = 0;
    }
    if (metrics.is_open() && log_now) log_step(metrics, r);
    if (on_step) on_step(r);
    const bool ckpt_now = o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : eval_now;
    if (ckpt_now && step < o.steps) checkpoint(step);
  }
  checkpoint(step);
  result.steps = step;
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  result.tokens_per_second =
      result.seconds > 0 ? static_cast<double>((step - first) * o.batch * seq) / result.seconds : 0;
  return result;
}

}  // namespace headlight::train

// AdamW, gradient clipping and the learning-rate schedule.

#include "headlight/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "headlight/ops/adamw.h"

namespace headlight::train {

AdamW::AdamW(const model::ParameterLayout& layout, const AdamWConfig& config)
    : config_(config),
      decay_(static_cast<size_t>(layout.total()), 0),
      m_(Tensor::zeros({layout.total()})),
      v_(Tensor::zeros({layout.total()})) {
  for (const auto& e : layout.entries())
    if (e.decay)
      std::fill(decay_.begin() + e.offset, decay_.begin() + e.offset + e.numel, uint8_t{1});
}

void AdamW::step(ThreadContext& ctx, float* params, const float* grads, float lr) {
  ++steps_;
  const float b1 = config_.beta1, b2 = config_.beta2;
  const double t = static_cast<double>(steps_);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  ops::adamw_update(ctx, {.params = params,
                          .grads = grads,
                          .m = m_.data(),
                          .v = v_.data(),
                          .decay = decay_.data(),
                          .n = m_.numel(),
                          .beta1 = b1,
                          .beta2 = b2,
                          .eps = config_.eps,
                          .step_size = lr / bc1,
                          .decay_factor = 1.0f - lr * config_.weight_decay,
                          .bc2_sqrt = bc2_sqrt});
}

double clip_grad_norm(ThreadContext& ctx, float* grads, int64_t n, double max_norm) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  ctx.parallel_for(chunks, [&](Range r, int) {
    for (int64_t c = r.begin; c < r.end; ++c) {
      double sum = 0.0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
        sum += static_cast<double>(grads[i]) * grads[i];
      partial[static_cast<size_t>(c)] = sum;
    }
  });
  double sum = 0.0;
  for (double p : partial) sum += p;
  const double norm = std::sqrt(sum);
  if (max_norm > 0.0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      ctx.parallel_for(n, [&](Range r, int) {
        for (int64_t i = r.begin; i < r.end; ++i) grads[i] *= c;
      });
    }
  }
  return norm;
}

float LrSchedule::at(int64_t step) const {
  if (step < warmup) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup + 1);
  if (step >= total) return min_lr;
  const double ratio = static_cast<double>(step - warmup) /
                       static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

}  // namespace headlight::train

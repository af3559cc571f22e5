// AdamW, gradient clipping and the learning-rate schedule.

#include "headlight/train/optimizer.h"

#include <cmath>

namespace headlight::train {

AdamW::AdamW(const model::ParameterLayout& layout, const AdamWConfig& config)
    : config_(config),
      decay_(static_cast<size_t>(layout.total()), 0),
      m_(decay_.size(), 0.0f),
      v_(decay_.size(), 0.0f) {
  for (const auto& e : layout.entries())
    if (e.decay)
      std::fill(decay_.begin() + e.offset, decay_.begin() + e.offset + e.numel, uint8_t{1});
}

void AdamW::step(float* params, const float* grads, float lr) {
  ++steps_;
  const float b1 = config_.beta1, b2 = config_.beta2;
  const double t = static_cast<double>(steps_);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * config_.weight_decay;
  const size_t n = m_.size();
  for (size_t i = 0; i < n; ++i) {
    float p = params[i];
    if (decay_[i]) p *= decay;
    const float g = grads[i];
    m_[i] = b1 * m_[i] + (1.0f - b1) * g;
    v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
    const float denom = std::sqrt(v_[i]) / bc2_sqrt + config_.eps;
    params[i] = p - step_size * m_[i] / denom;
  }
}

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(grads[i]) * grads[i];
  const double norm = std::sqrt(sum);
  if (max_norm > 0.0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      for (int64_t i = 0; i < n; ++i) grads[i] *= c;
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

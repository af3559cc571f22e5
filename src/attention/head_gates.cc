// Per-head gates (see headlight/attention/head_gates.h).

#include "headlight/attention/head_gates.h"

#include <algorithm>

#include "headlight/core/error.h"

namespace headlight::attention {

HeadGates::HeadGates(int64_t layers, int64_t heads)
    : layers_(layers),
      heads_(heads),
      values_(Tensor::empty({layers, heads})),
      grads_(Tensor::zeros({layers, heads})) {
  values_.fill(1.0f);
}

std::vector<float> HeadGates::snapshot() const {
  return {values(), values() + size()};
}

void HeadGates::restore(std::span<const float> v) {
  check(static_cast<int64_t>(v.size()) == size(), "gates: expected {} values, got {}", size(),
        v.size());
  std::copy(v.begin(), v.end(), values());
}

void HeadGates::zero_grads() {
  grads_.fill(0.0f);
}

bool HeadGates::ones(int64_t layer) const {
  const float* gates = values() + layer * heads_;
  for (int64_t h = 0; h < heads_; ++h)
    if (gates[h] != 1.0f) return false;
  return true;
}

void HeadGates::forward(ThreadContext& ctx, int64_t layer, const GatedRows& x_shape, const float* x,
                        float* out) const {
  const int64_t H = x_shape.heads, d = x_shape.head_dim;
  const float* gates = values() + layer * heads_;
  ctx.parallel_for(x_shape.rows, [&](Range range, int) {
    for (int64_t r = range.begin; r < range.end; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const float g = gates[h];
        const float* a = x + (r * H + h) * d;
        float* o = out + (r * H + h) * d;
        for (int64_t e = 0; e < d; ++e) o[e] = a[e] * g;
      }
  });
}

void HeadGates::backward(ThreadContext& ctx, int64_t layer, const GatedRows& x_shape,
                         const float* x, const float* dout, float* dx) {
  const int64_t H = x_shape.heads, d = x_shape.head_dim;
  const float* gates = values() + layer * heads_;
  float* dgates = grads_.data() + layer * heads_;
  ctx.parallel_for(H, [&](Range heads, int) {
    for (int64_t h = heads.begin; h < heads.end; ++h) {
      double sum = 0.0;
      for (int64_t r = 0; r < x_shape.rows; ++r) {
        const float* g = dout + (r * H + h) * d;
        const float* v = x + (r * H + h) * d;
        float* o = dx + (r * H + h) * d;
        for (int64_t e = 0; e < d; ++e) {
          sum += static_cast<double>(g[e]) * v[e];
          o[e] = g[e] * gates[h];
        }
      }
      dgates[h] += static_cast<float>(sum);
    }
  });
}

}  // namespace headlight::attention

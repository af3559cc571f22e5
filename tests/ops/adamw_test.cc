#include "headlight/ops/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "headlight/core/rng.h"

namespace headlight::ops {
namespace {

// The specification: torch.optim.AdamW's update of one element, in float, in this order.
void adamw_scalar(const AdamWUpdate& u) {
  for (int64_t i = 0; i < u.n; ++i) {
    const float p = u.decay[i] ? u.params[i] * u.decay_factor : u.params[i];
    const float g = u.grads[i];
    u.m[i] = u.beta1 * u.m[i] + (1.0f - u.beta1) * g;
    u.v[i] = u.beta2 * u.v[i] + (1.0f - u.beta2) * g * g;
    const float denom = std::sqrt(u.v[i]) / u.bc2_sqrt + u.eps;
    u.params[i] = p - u.step_size * u.m[i] / denom;
  }
}

TEST(AdamW, EveryTargetGivesTheScalarBits) {
  // An odd length (a vector tail on every target), weight decay on some elements only, moments
  // from earlier steps, gradients over many magnitudes (and zeros); any thread count.
  const int64_t n = 1000 + 13;
  Generator rng(5);
  std::vector<float> p(n), g(n), m(n), v(n);
  std::vector<uint8_t> decay(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(rng.normal());
    g[i] = i % 17 == 0 ? 0.0f : static_cast<float>(rng.normal() * std::pow(10.0, i % 9 - 6));
    m[i] = static_cast<float>(rng.normal() * 1e-3);
    v[i] = static_cast<float>(std::fabs(rng.normal()) * 1e-6);
    decay[i] = i % 3 != 0;
  }
  for (int threads : {1, 2, 3}) {
    std::vector<float> p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v;
    const AdamWUpdate base{.grads = g.data(),
                           .decay = decay.data(),
                           .n = n,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .step_size = 3e-4f / 0.19f,
                           .decay_factor = 1.0f - 3e-4f * 0.1f,
                           .bc2_sqrt = std::sqrt(1.0f - 0.95f * 0.95f)};
    AdamWUpdate want = base, got = base;
    want.params = p1.data(), want.m = m1.data(), want.v = v1.data();
    got.params = p2.data(), got.m = m2.data(), got.v = v2.data();
    adamw_scalar(want);
    ThreadContext ctx(threads);
    adamw_update(ctx, got);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(m2[i], m1[i]) << i;
      ASSERT_EQ(v2[i], v1[i]) << i;
      ASSERT_EQ(p2[i], p1[i]) << i;
    }
  }
}

}  // namespace
}  // namespace headlight::ops

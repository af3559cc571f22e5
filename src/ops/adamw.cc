// The AdamW update (headlight/ops/adamw.h): one pass over the parameters, their gradients and the
// two moments, memory-bound (7 floats and a byte moved per parameter). The vector loop performs
// the scalar expression's operations in its order, without fused multiply-adds (the build keeps
// floating-point contraction off), so every target gives the scalar loop's bits.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/ops/adamw.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstdint>

#include "headlight/ops/adamw.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void AdamWRange(const ops::AdamWUpdate& u, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const auto L = static_cast<int64_t>(hn::Lanes(d));
  const float b1 = u.beta1, b2 = u.beta2, one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
  const auto vb1 = hn::Set(d, b1), vb2 = hn::Set(d, b2), v1b1 = hn::Set(d, one_b1),
             v1b2 = hn::Set(d, one_b2), veps = hn::Set(d, u.eps), vstep = hn::Set(d, u.step_size),
             vdecay = hn::Set(d, u.decay_factor), vbc2 = hn::Set(d, u.bc2_sqrt);
  int64_t i = begin;
  for (; i + L <= end; i += L) {
    const auto decays = hn::Ne(hn::PromoteTo(du, hn::LoadU(d8, u.decay + i)), hn::Zero(du));
    const auto p0 = hn::LoadU(d, u.params + i);
    const auto p = hn::IfThenElse(hn::RebindMask(d, decays), hn::Mul(p0, vdecay), p0);
    const auto g = hn::LoadU(d, u.grads + i);
    const auto m = hn::Add(hn::Mul(vb1, hn::LoadU(d, u.m + i)), hn::Mul(v1b1, g));
    const auto v = hn::Add(hn::Mul(vb2, hn::LoadU(d, u.v + i)), hn::Mul(hn::Mul(v1b2, g), g));
    hn::StoreU(m, d, u.m + i);
    hn::StoreU(v, d, u.v + i);
    const auto denom = hn::Add(hn::Div(hn::Sqrt(v), vbc2), veps);
    hn::StoreU(hn::Sub(p, hn::Div(hn::Mul(vstep, m), denom)), d, u.params + i);
  }
  for (; i < end; ++i) {
    const float p = u.decay[i] ? u.params[i] * u.decay_factor : u.params[i];
    const float g = u.grads[i];
    u.m[i] = b1 * u.m[i] + one_b1 * g;
    u.v[i] = b2 * u.v[i] + one_b2 * g * g;
    const float denom = std::sqrt(u.v[i]) / u.bc2_sqrt + u.eps;
    u.params[i] = p - u.step_size * u.m[i] / denom;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace headlight {

HWY_EXPORT(AdamWRange);

namespace ops {

void adamw_update(ThreadContext& ctx, const AdamWUpdate& u) {
  ctx.parallel_for(u.n, [&](Range r, int) { HWY_DYNAMIC_DISPATCH(AdamWRange)(u, r.begin, r.end); });
}

}  // namespace ops
}  // namespace headlight

#endif  // HWY_ONCE

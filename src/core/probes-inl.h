// Per-target inner loops of the machine probes:
// - the FMA peak: 16 independent accumulator chains of fused multiply-adds, enough to cover the
//   FMA latency (4 cycles) times the FMA ports (2) of current x86 and Arm cores, no memory traffic;
// - the read bandwidth: a streaming sum over a buffer much larger than the caches.

#if defined(HEADLIGHT_CORE_PROBES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADLIGHT_CORE_PROBES_INL_H_
#undef HEADLIGHT_CORE_PROBES_INL_H_
#else
#define HEADLIGHT_CORE_PROBES_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iterations` rounds of 16 vector FMAs; returns the number of floating-point operations and
// stores a reduction of the accumulators in *sink so the compiler cannot drop the work.
inline double FmaChains(int64_t iterations, float* sink) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.9999999f);
  const auto c = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.01f), a2 = hn::Set(d, 1.02f),
       a3 = hn::Set(d, 1.03f);
  auto a4 = hn::Set(d, 1.04f), a5 = hn::Set(d, 1.05f), a6 = hn::Set(d, 1.06f),
       a7 = hn::Set(d, 1.07f);
  auto a8 = hn::Set(d, 1.08f), a9 = hn::Set(d, 1.09f), a10 = hn::Set(d, 1.1f),
       a11 = hn::Set(d, 1.11f);
  auto a12 = hn::Set(d, 1.12f), a13 = hn::Set(d, 1.13f), a14 = hn::Set(d, 1.14f);
  auto a15 = hn::Set(d, 1.15f);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
    a12 = hn::MulAdd(a12, m, c);
    a13 = hn::MulAdd(a13, m, c);
    a14 = hn::MulAdd(a14, m, c);
    a15 = hn::MulAdd(a15, m, c);
  }
  auto s =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)),
                         hn::Add(hn::Add(a12, a13), hn::Add(a14, a15))));
  *sink += hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 16.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iterations);
}

// Σ x[0..n) with four accumulators (n a multiple of 4 vectors); touches every byte once.
inline float StreamSum(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 4 * L <= n; i += 4 * L) {
    s0 = hn::Add(s0, hn::LoadU(d, x + i));
    s1 = hn::Add(s1, hn::LoadU(d, x + i + L));
    s2 = hn::Add(s2, hn::LoadU(d, x + i + 2 * L));
    s3 = hn::Add(s3, hn::LoadU(d, x + i + 3 * L));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

inline int FloatLanes() {
  return static_cast<int>(hn::Lanes(hn::ScalableTag<float>()));
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle

#include "headlight/core/rng.h"

#include <cmath>
#include <numbers>

namespace headlight {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

uint32_t Generator::next_u32() {
  if (used_ == 4) {
    block_ = philox4x32(seed_, 0x5EEDull, counter_++);
    used_ = 0;
  }
  return block_[static_cast<size_t>(used_++)];
}

float Generator::uniform(float lo, float hi) {
  return lo + (hi - lo) * uniform_from_bits(next_u32());
}

void Generator::fill_uniform(float* x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) x[i] = uniform(lo, hi);
}

float Generator::normal(float mean, float stddev) {
  // u1 in (0, 1] so that log(u1) is finite.
  const double u1 = 1.0 - static_cast<double>(uniform_from_bits(next_u32()));
  const double u2 = static_cast<double>(uniform_from_bits(next_u32()));
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return mean + stddev * static_cast<float>(z);
}

}  // namespace headlight

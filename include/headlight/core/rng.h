// Seeded, counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// A counter-based generator maps (key, counter) to random bits with no state in between, so the
// value for element i is the same whichever thread computes it and in whatever order: dropout masks
// do not depend on the thread count. `Generator` is a sequential stream on top of it, for weight
// initialisation.
#pragma once

#include <array>
#include <cstdint>

namespace headlight {

// Philox4x32 with 10 rounds: four 32-bit words from a 64-bit key and a 128-bit counter.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Uniform float in [0, 1) from 32 random bits (24 significant bits).
inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// The random value for element `index` of stream `stream` under `seed`: stateless, any order.
class CounterRng {
 public:
  explicit CounterRng(uint64_t seed, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  float uniform(uint64_t index) const {
    return uniform_from_bits(philox4x32(seed_, stream_, index >> 2)[index & 3]);
  }

 private:
  uint64_t seed_;
  uint64_t stream_;
};

// A sequential stream of random numbers for initialisation and sampling.
class Generator {
 public:
  explicit Generator(uint64_t seed) : seed_(seed) {}
  uint32_t next_u32();
  // Uniform in [lo, hi).
  float uniform(float lo = 0.0f, float hi = 1.0f);
  // x[0..n) ← uniform(lo, hi), in order.
  void fill_uniform(float* x, int64_t n, float lo, float hi);
  // Standard normal (Box-Muller).
  float normal(float mean = 0.0f, float stddev = 1.0f);

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

}  // namespace headlight

// bf16 conversions: the scalar definitions against known values (round to nearest even, NaN,
// infinities, overflow, denormals), and the SIMD array forms bit for bit against the scalar ones on
// every float32 pattern class (blocks of denormals too, which AVX-512 BF16 alone would flush), on
// every instruction set this machine has.

#include "headlight/core/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "headlight/core/cpu_info.h"
#include "headlight/core/rng.h"

namespace headlight {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Bf16, ScalarRoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(to_bf16(from_bits(0x3F808000)).bits, 0x3F80);              // tie, even below
  EXPECT_EQ(to_bf16(from_bits(0x3F818000)).bits, 0x3F82);              // tie, even above
  EXPECT_EQ(to_bf16(from_bits(0x3F808001)).bits, 0x3F81);              // above the tie
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7F80);  // overflows to inf
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xFF80);
  EXPECT_EQ(to_bf16(from_bits(0x7F800001)).bits, 0x7FC0);  // signalling NaN → quiet
  EXPECT_EQ(to_bf16(from_bits(0xFFC12345)).bits, 0xFFC1);
  EXPECT_EQ(to_bf16(from_bits(0x00012345)).bits, 0x0001);  // denormals kept
  EXPECT_EQ(to_float(bf16{0xC049}), -3.140625f);
  for (uint32_t b = 0; b < 0x10000; ++b) {  // widening then narrowing is the identity
    const bf16 x{static_cast<uint16_t>(b)};
    const float f = to_float(x);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_bf16(f).bits, x.bits);
  }
}

TEST(Bf16, ArraysEqualTheScalarFormsOnEveryTarget) {
  Generator g(7);
  std::vector<float> x(4099);
  for (size_t i = 0; i < x.size(); ++i) {
    // Random bit patterns: every exponent, NaNs, infinities, denormals and ties among them.
    uint32_t bits = g.next_u32();
    if (i % 7 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;  // exact ties
    x[i] = from_bits(bits);
  }
  for (size_t i = 0; i < 64; ++i) x[1000 + i] = from_bits(0x00400000u + static_cast<uint32_t>(i));
  for (const char* isa : {"best", "avx3", "avx2", "sse4", "scalar"}) {
    force_isa(isa);
    std::vector<bf16> narrow(x.size());
    to_bf16(x.data(), narrow.data(), x.size());
    std::vector<float> wide(x.size());
    to_float(narrow.data(), wide.data(), wide.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(narrow[i].bits, to_bf16(x[i]).bits) << isa << " at " << i;
      const float w = to_float(narrow[i]);
      ASSERT_EQ(std::memcmp(&wide[i], &w, 4), 0) << isa << " at " << i;
    }
  }
  force_isa("best");
}

}  // namespace
}  // namespace headlight

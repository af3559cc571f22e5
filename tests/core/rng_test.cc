#include "headlight/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace headlight {
namespace {

TEST(Philox, MatchesPublishedKnownAnswer) {
  // Random123's known-answer test for philox4x32-10 with all-zero counter and key.
  auto r = philox4x32(0, 0, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(CounterRng, IsStatelessAndSeeded) {
  CounterRng a(42), b(42), c(43);
  EXPECT_EQ(a.uniform(12345), b.uniform(12345));
  EXPECT_NE(a.uniform(12345), c.uniform(12345));
  // Order of evaluation does not matter.
  float x = a.uniform(7);
  (void)a.uniform(8);
  EXPECT_EQ(a.uniform(7), x);
}

TEST(Generator, UniformAndNormalHaveTheRightMoments) {
  Generator g(1);
  double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = g.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum2 += u * u;
    const double z = g.normal();
    nsum += z;
    nsum2 += z * z;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(sum2 / n - 0.25, 1.0 / 12, 0.01);
  EXPECT_NEAR(nsum / n, 0.0, 0.01);
  EXPECT_NEAR(nsum2 / n, 1.0, 0.02);
}

}  // namespace
}  // namespace headlight

#include "headlight/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace headlight::ops {
namespace {

TEST(Softmax, RowsSumToOneAndMaskedEntriesAreZero) {
  const float inf = std::numeric_limits<float>::infinity();
  float x[3][4] = {{1, 2, 3, 4}, {0, -inf, 1000, 1000}, {-inf, -inf, -inf, -inf}};
  softmax_rows(&x[0][0], 3, 4, 4);
  double s = 0;
  for (int c = 0; c < 4; ++c) s += x[0][c];
  EXPECT_NEAR(s, 1.0, 1e-6);
  EXPECT_NEAR(x[0][3] / x[0][2], std::exp(1.0), 1e-5);
  EXPECT_EQ(x[1][1], 0.0f);
  EXPECT_NEAR(x[1][2], 0.5f, 1e-7);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(x[2][c], 0.0f);
}

TEST(Softmax, NanStaysInItsRow) {
  float x[2][2] = {{std::nanf(""), 1}, {1, 2}};
  softmax_rows(&x[0][0], 2, 2, 2);
  EXPECT_TRUE(std::isnan(x[0][0]));
  EXPECT_FALSE(std::isnan(x[1][0]));
}

}  // namespace
}  // namespace headlight::ops

namespace headlight::ops {
namespace {

TEST(Softmax, LongRowsMatchDoublePrecision) {
  // Long enough for the SIMD body and a scalar tail.
  std::vector<float> x(3 * 37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 5.0f;
  x[40] = -std::numeric_limits<float>::infinity();
  std::vector<float> y = x;
  softmax_rows(y.data(), 3, 37, 37);
  for (int r = 0; r < 3; ++r) {
    double m = -1e300, z = 0;
    for (int c = 0; c < 37; ++c) m = std::max(m, double(x[r * 37 + c]));
    for (int c = 0; c < 37; ++c) z += std::exp(double(x[r * 37 + c]) - m);
    for (int c = 0; c < 37; ++c)
      EXPECT_NEAR(y[r * 37 + c], std::exp(double(x[r * 37 + c]) - m) / z, 2e-7);
  }
  EXPECT_EQ(y[40], 0.0f);
}

}  // namespace
}  // namespace headlight::ops

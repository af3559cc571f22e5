#include "headlight/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

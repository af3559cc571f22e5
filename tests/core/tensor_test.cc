#include "headlight/core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace headlight {
namespace {

TEST(Tensor, IsAlignedAndSized) {
  Tensor t(DType::f32, {3, 5, 7});
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_EQ(t.view().strides(), (Shape{35, 7, 1}));
  EXPECT_TRUE(t.view().is_contiguous());
}

TEST(Tensor, LargeTensorsStartOnA2MiBBoundary) {
  // From 4 MiB a tensor starts on a 2 MiB boundary (where Linux may back it with huge pages);
  // below, on a 64-byte one. Every element is writable and reads back.
  for (const int64_t n : {int64_t{1} << 20, (int64_t{1} << 20) + 17, int64_t{3} << 20}) {
    Tensor t(DType::f32, {n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % (uintptr_t{2} << 20), 0u) << n;
    t.fill(2.5f);
    EXPECT_EQ(t.data()[0], 2.5f);
    EXPECT_EQ(t.data()[n - 1], 2.5f);
  }
  Tensor small(DType::bf16, {(int64_t{2} << 20) - 32});  // just under 4 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
}

TEST(Tensor, ZeroSizedShapesAreAllowed) {
  Tensor t = Tensor::zeros({0, 4});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(contiguous_copy(t.view()).numel(), 0);
}

TEST(Tensor, OverflowingShapeThrowsNamingTheArgument) {
  const int64_t big = int64_t{1} << 40;
  try {
    checked_numel({big, big}, "query");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("query"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checked_numel({-1, 3}, "key"), Error);
}

// An allocation no machine can give (4 PiB, past x86-64's 128 TiB of user address space) names
// the tensor and its size, and is still a std::bad_alloc for callers that handle those.
TEST(Tensor, AFailedAllocationNamesTheTensor) {
  try {
    Tensor t(DType::f32, {int64_t{1} << 50});
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_STREQ(e.what(), "Tensor [1125899906842624] float32: cannot allocate 4096.0 TiB");
  }
  EXPECT_THROW(Tensor(DType::bf16, {int64_t{1} << 24, int64_t{1} << 26}), std::bad_alloc);
}

TEST(TensorView, BroadcastGivesZeroStrides) {
  Tensor t = Tensor::zeros({3, 1});
  TensorView v = t.view().broadcast_to({2, 3, 4}, "mask");
  EXPECT_EQ(v.strides(), (Shape{0, 1, 0}));
  EXPECT_THROW(t.view().broadcast_to({2, 4, 4}, "mask"), Error);
}

TEST(TensorView, ContiguousCopyFollowsStrides) {
  Tensor t(DType::f32, {2, 3});
  for (int i = 0; i < 6; ++i) t.data()[i] = static_cast<float>(i);
  // Transposed view: shape [3, 2], strides [1, 3].
  TensorView tv(t.data(), DType::f32, {3, 2}, {1, 3});
  Tensor c = contiguous_copy(tv);
  const float expected[] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.data()[i], expected[i]);
}

TEST(Tensor, SumToShapeReversesBroadcast) {
  Tensor big(DType::f32, {2, 3, 4});
  for (int i = 0; i < 24; ++i) big.data()[i] = static_cast<float>(i);
  Tensor s = sum_to_shape(big, {3, 1});
  ASSERT_EQ(s.shape(), (Shape{3, 1}));
  for (int j = 0; j < 3; ++j) {
    float expect = 0;
    for (int b = 0; b < 2; ++b)
      for (int k = 0; k < 4; ++k) expect += static_cast<float>(b * 12 + j * 4 + k);
    EXPECT_EQ(s.data()[j], expect);
  }
}

TEST(Shapes, BroadcastShapes) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}, "x"), (Shape{2, 3, 4}));
  EXPECT_THROW(broadcast_shapes({2, 3}, {4}, "x"), Error);
}

}  // namespace
}  // namespace headlight

// The PyTorch-semantics front end: broadcasting, GQA, masks, empty shapes and bad input.

#include "headlight/attention/sdpa.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "headlight/core/rng.h"
#include "test_util.h"

namespace headlight::attention {
namespace {

using headlight::testing::expect_error;
using headlight::testing::random_tensor;

TEST(Sdpa, BroadcastBatchDimsEqualExplicitCopies) {
  ThreadContext ctx(1);
  Tensor q = random_tensor({2, 3, 2, 4, 8}, 1);
  Tensor k = random_tensor({1, 1, 2, 6, 8}, 2);  // broadcast over both batch dims
  Tensor v = random_tensor({3, 2, 6, 5}, 3);     // broadcast over the first
  Tensor out = scaled_dot_product_attention(ctx, q.view(), k.view(), v.view());
  ASSERT_EQ(out.shape(), (Shape{2, 3, 2, 4, 5}));
  // Batch (1, 2) computed alone.
  Tensor q1 = Tensor::empty({2, 4, 8});
  std::copy(q.data() + (1 * 3 + 2) * 64, q.data() + (1 * 3 + 3) * 64, q1.data());
  Tensor v1 = Tensor::empty({2, 6, 5});
  std::copy(v.data() + 2 * 60, v.data() + 3 * 60, v1.data());
  Tensor k1 = contiguous_copy(k.view()).reshaped({2, 6, 8});
  Tensor o1 = scaled_dot_product_attention(ctx, q1.view(), k1.view(), v1.view());
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(out.data()[(1 * 3 + 2) * 40 + i], o1.data()[i]);
}

TEST(Sdpa, TwoDimensionalInputs) {
  ThreadContext ctx(1);
  Tensor q = random_tensor({3, 4}, 1), k = random_tensor({5, 4}, 2), v = random_tensor({5, 2}, 3);
  Tensor out = scaled_dot_product_attention(ctx, q.view(), k.view(), v.view());
  EXPECT_EQ(out.shape(), (Shape{3, 2}));
  SdpaGrads g =
      scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), out.view());
  EXPECT_EQ(g.query.shape(), q.shape());
  EXPECT_EQ(g.key.shape(), k.shape());
  EXPECT_EQ(g.value.shape(), v.shape());
}

TEST(Sdpa, BroadcastKeyGradientIsSummedOverTheBatch) {
  ThreadContext ctx(1);
  Tensor q = random_tensor({3, 1, 2, 4}, 1), k = random_tensor({1, 1, 5, 4}, 2);
  Tensor v = random_tensor({1, 1, 5, 3}, 3), go = random_tensor({3, 1, 2, 3}, 4);
  SdpaGrads g = scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), go.view());
  ASSERT_EQ(g.key.shape(), k.shape());
  // The same key repeated explicitly.
  Tensor k3 = Tensor::empty({3, 1, 5, 4}), v3 = Tensor::empty({3, 1, 5, 3});
  for (int b = 0; b < 3; ++b) {
    std::copy(k.data(), k.data() + 20, k3.data() + b * 20);
    std::copy(v.data(), v.data() + 15, v3.data() + b * 15);
  }
  SdpaGrads g3 =
      scaled_dot_product_attention_backward(ctx, q.view(), k3.view(), v3.view(), go.view());
  for (int i = 0; i < 20; ++i) {
    const float sum = g3.key.data()[i] + g3.key.data()[20 + i] + g3.key.data()[40 + i];
    EXPECT_NEAR(g.key.data()[i], sum, 1e-6);
  }
}

TEST(Sdpa, BackwardFromTheSavedOutputAndLseEqualsRecomputing) {
  // The forward's output and log-sum-exp handed to the backward (as an autograd graph keeps them)
  // give the gradients the backward computes by recomputing them: bit for bit in float32, with a
  // broadcast batch dim, GQA, a mask and dropout (the saved forward used the same seed).
  ThreadContext ctx(2);
  Tensor q = random_tensor({2, 4, 37, 16}, 1), k = random_tensor({1, 2, 45, 16}, 2);
  Tensor v = random_tensor({1, 2, 45, 8}, 3), go = random_tensor({2, 4, 37, 8}, 4);
  Tensor mask = random_tensor({37, 45}, 5);
  SdpaOptions o{
      .attn_mask = mask.view(), .dropout_p = 0.2f, .dropout_seed = 11, .enable_gqa = true};
  SdpaOutput f = scaled_dot_product_attention_with_lse(ctx, q.view(), k.view(), v.view(), o);
  ASSERT_EQ(f.lse.shape(), (Shape{2, 4, 37}));
  Tensor plain = scaled_dot_product_attention(ctx, q.view(), k.view(), v.view(), o);
  for (int64_t i = 0; i < plain.numel(); ++i) ASSERT_EQ(f.output.data()[i], plain.data()[i]);
  const SdpaGrads want =
      scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), go.view(), o);
  const SdpaGrads got = scaled_dot_product_attention_backward(
      ctx, q.view(), k.view(), v.view(), go.view(), o, {f.output.view(), f.lse.view()});
  for (auto [a, b] : {std::pair{&want.query, &got.query}, std::pair{&want.key, &got.key},
                      std::pair{&want.value, &got.value}})
    for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(a->data()[i], b->data()[i]) << i;
  // The saved tensors are what the backward uses: a changed lse changes the gradients.
  for (int64_t i = 0; i < f.lse.numel(); ++i) f.lse.data()[i] += 0.5f;
  const SdpaGrads moved = scaled_dot_product_attention_backward(
      ctx, q.view(), k.view(), v.view(), go.view(), o, {f.output.view(), f.lse.view()});
  EXPECT_NE(moved.query.data()[0], want.query.data()[0]);
  // Saved tensors of the wrong shape or dtype, or only one of them, are named.
  expect_error(
      [&] {
        scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), go.view(), o,
                                              {f.output.view(), {}});
      },
      {"saved", "lse"});
  expect_error(
      [&] {
        scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), go.view(), o,
                                              {go.view(), f.output.view()});
      },
      {"saved lse", "[2, 4, 37]"});
  expect_error(
      [&] {
        scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), go.view(), o,
                                              {q.view(), f.lse.view()});
      },
      {"saved output", "[2, 4, 37, 8]"});
}

TEST(Sdpa, GroupedQueryAttentionNeedsEnableGqa) {
  ThreadContext ctx(1);
  Tensor q = random_tensor({1, 4, 3, 8}, 1), k = random_tensor({1, 2, 3, 8}, 2);
  Tensor v = random_tensor({1, 2, 3, 8}, 3);
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k.view(), v.view()); },
               {"key", "2 heads", "4 heads", "enable_gqa"});
  SdpaOptions o;
  o.enable_gqa = true;
  Tensor out = scaled_dot_product_attention(ctx, q.view(), k.view(), v.view(), o);
  EXPECT_EQ(out.shape(), (Shape{1, 4, 3, 8}));
  Tensor k3 = random_tensor({1, 3, 3, 8}, 2), v3 = random_tensor({1, 3, 3, 8}, 3);
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k3.view(), v3.view(), o); },
               {"must divide"});
}

TEST(Sdpa, EmptySequencesGiveEmptyOrZeroOutput) {
  ThreadContext ctx(1);
  Tensor q0 = random_tensor({2, 0, 4}, 1), k = random_tensor({2, 3, 4}, 2),
         v = random_tensor({2, 3, 5}, 3);
  EXPECT_EQ(scaled_dot_product_attention(ctx, q0.view(), k.view(), v.view()).shape(),
            (Shape{2, 0, 5}));
  Tensor q = random_tensor({2, 2, 4}, 1), k0 = random_tensor({2, 0, 4}, 2),
         v0 = random_tensor({2, 0, 5}, 3);
  Tensor out = scaled_dot_product_attention(ctx, q.view(), k0.view(), v0.view());
  ASSERT_EQ(out.shape(), (Shape{2, 2, 5}));
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.data()[i], 0.0f);
  SdpaGrads g =
      scaled_dot_product_attention_backward(ctx, q.view(), k0.view(), v0.view(), out.view());
  for (int64_t i = 0; i < g.query.numel(); ++i) EXPECT_EQ(g.query.data()[i], 0.0f);
}

TEST(Sdpa, BadInputNamesTheArgumentAndShapes) {
  ThreadContext ctx(1);
  Tensor q = random_tensor({1, 2, 3, 4}, 1), k = random_tensor({1, 2, 5, 4}, 2);
  Tensor v = random_tensor({1, 2, 5, 6}, 3);
  Tensor k_bad_dim = random_tensor({1, 2, 5, 3}, 2);
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k_bad_dim.view(), v.view()); },
               {"key", "[1, 2, 5, 3]", "[1, 2, 3, 4]"});
  Tensor v_bad_len = random_tensor({1, 2, 4, 6}, 3);
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k.view(), v_bad_len.view()); },
               {"value", "length"});
  Tensor k_bad_batch = random_tensor({3, 2, 5, 4}, 2), q2 = random_tensor({2, 2, 3, 4}, 1);
  expect_error([&] { scaled_dot_product_attention(ctx, q2.view(), k_bad_batch.view(), v.view()); },
               {"batch"});
  Tensor one_dim = random_tensor({4}, 1);
  expect_error([&] { scaled_dot_product_attention(ctx, one_dim.view(), k.view(), v.view()); },
               {"query"});
  SdpaOptions o;
  Tensor mask = random_tensor({3, 4}, 9);
  o.attn_mask = mask.view();
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k.view(), v.view(), o); },
               {"attn_mask", "[3, 4]", "[1, 2, 3, 5]"});
  Tensor q_bf16 = Tensor::zeros(DType::bf16, q.shape());
  expect_error([&] { scaled_dot_product_attention(ctx, q_bf16.view(), k.view(), v.view()); },
               {"key", "dtype", "float32", "bfloat16"});
  o = {};
  o.scale = std::nanf("");
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k.view(), v.view(), o); },
               {"scale"});
  o = {};
  o.dropout_p = -0.1f;
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k.view(), v.view(), o); },
               {"dropout_p"});
  o.dropout_p = 1.0f;
  expect_error([&] { scaled_dot_product_attention(ctx, q.view(), k.view(), v.view(), o); },
               {"dropout_p"});
  Tensor go = random_tensor({1, 2, 3, 5}, 4);
  expect_error(
      [&] { scaled_dot_product_attention_backward(ctx, q.view(), k.view(), v.view(), go.view()); },
      {"grad_output", "[1, 2, 3, 6]"});
  // A huge shape whose element count overflows is reported, not allocated.
  const int64_t big = int64_t{1} << 32;
  TensorView huge(q.data(), DType::f32, {big, big, 2, 3, 4}, {0, 0, 12, 4, 1});
  expect_error([&] { scaled_dot_product_attention(ctx, huge, k.view(), v.view()); }, {"overflow"});
}

}  // namespace
}  // namespace headlight::attention

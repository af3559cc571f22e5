// MultiheadAttention in C++: configuration and input errors, gates, state dicts, empty inputs and
// gradients against finite differences. (Numerics against torch.nn.MultiheadAttention are in
// python/tests/test_multihead_attention.py.)

#include "headlight/attention/multihead_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "headlight/core/rng.h"
#include "test_util.h"

namespace headlight::attention {
namespace {

using headlight::testing::expect_error;
using headlight::testing::random_tensor;

MultiheadAttentionConfig config(int64_t E, int64_t H) {
  return {.embed_dim = E, .num_heads = H};
}

TEST(MultiheadAttention, RejectsBadConfigs) {
  expect_error([] { MultiheadAttention m(config(10, 3)); }, {"embed_dim (10)", "num_heads (3)"});
  auto c = config(8, 4);
  c.num_kv_heads = 3;
  expect_error([&] { MultiheadAttention m(c); }, {"num_kv_heads (3)", "num_heads (4)"});
  c = config(8, 4);
  c.dropout = 1.0f;
  expect_error([&] { MultiheadAttention m(c); }, {"dropout"});
  c.dropout = -0.5f;
  expect_error([&] { MultiheadAttention m(c); }, {"dropout"});
}

TEST(MultiheadAttention, ParameterNamesFollowPyTorch) {
  MultiheadAttention packed(config(8, 2));
  EXPECT_EQ(packed.parameter_names(),
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                      "out_proj.bias"}));
  auto c = config(8, 2);
  c.kdim = 5;
  c.add_bias_kv = true;
  c.num_kv_heads = 1;
  MultiheadAttention separate(c);
  EXPECT_EQ(
      separate.parameter_names(),
      (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                "bias_k", "bias_v", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(separate.parameter("k_proj_weight").shape(), (Shape{4, 5}));
  EXPECT_EQ(separate.parameter("in_proj_bias").shape(), (Shape{16}));
}

TEST(MultiheadAttention, RejectsBadInputsNamingShapes) {
  ThreadContext ctx(1);
  MultiheadAttention m(config(8, 2));
  Tensor x = random_tensor({5, 2, 8}, 1), wrong_e = random_tensor({5, 2, 6}, 2);
  expect_error([&] { m.forward(ctx, wrong_e.view(), x.view(), x.view()); },
               {"query", "embed_dim 8"});
  Tensor other_batch = random_tensor({5, 3, 8}, 3);
  expect_error([&] { m.forward(ctx, x.view(), other_batch.view(), other_batch.view()); },
               {"batch size", "[5, 3, 8]"});
  Tensor key = random_tensor({4, 2, 8}, 4), value = random_tensor({6, 2, 8}, 5);
  expect_error([&] { m.forward(ctx, x.view(), key.view(), value.view()); }, {"value", "length"});
  MhaForwardOptions o;
  Tensor mask = Tensor::zeros({5, 4});
  o.attn_mask = mask.view();
  expect_error([&] { m.forward(ctx, x.view(), x.view(), x.view(), o); },
               {"attn_mask", "[5, 4]", "(5, 5)"});
  o = {};
  Tensor kpm = Tensor::zeros({3, 5});
  o.key_padding_mask = kpm.view();
  expect_error([&] { m.forward(ctx, x.view(), x.view(), x.view(), o); },
               {"key_padding_mask", "[3, 5]"});
  o = {};
  Tensor bf(DType::bf16, {5, 5});
  o.attn_mask = bf.view();
  expect_error([&] { m.forward(ctx, x.view(), x.view(), x.view(), o); }, {"attn_mask", "dtype"});
  expect_error([&] { m.backward(ctx, x.view()); }, {"forward first"});
  m.forward(ctx, x.view(), x.view(), x.view());
  Tensor bad_grad = random_tensor({5, 8}, 6);
  expect_error([&] { m.backward(ctx, bad_grad.view()); }, {"grad_output", "[5, 8]", "[5, 2, 8]"});
}

TEST(MultiheadAttention, LoadStateDictValidatesBeforeWriting) {
  MultiheadAttention m(config(4, 2));
  auto state = m.state_dict();
  std::map<std::string, TensorView> views;
  for (auto& [name, t] : state) views[name] = t.view();
  Tensor wrong = Tensor::zeros({3, 4});
  views["out_proj.weight"] = wrong.view();
  const float before = m.parameter("in_proj_weight").data()[0];
  expect_error([&] { m.load_state_dict(views); }, {"out_proj.weight", "[3, 4]", "[4, 4]"});
  EXPECT_EQ(m.parameter("in_proj_weight").data()[0], before);
  views["out_proj.weight"] = state.at("out_proj.weight").view();
  views["extra"] = wrong.view();
  expect_error([&] { m.load_state_dict(views); }, {"unexpected key 'extra'"});
  views.erase("extra");
  views.erase("in_proj_bias");
  expect_error([&] { m.load_state_dict(views); }, {"missing key 'in_proj_bias'"});
}

TEST(MultiheadAttention, ZeroLengthInputsGiveEmptyOutputs) {
  ThreadContext ctx(1);
  MultiheadAttention m(config(8, 2));
  Tensor q = random_tensor({0, 2, 8}, 1), kv = random_tensor({3, 2, 8}, 2);
  MhaOutput out = m.forward(ctx, q.view(), kv.view(), kv.view());
  EXPECT_EQ(out.output.shape(), (Shape{0, 2, 8}));
  EXPECT_EQ(out.weights.shape(), (Shape{2, 0, 3}));
  Tensor q2 = random_tensor({4, 2, 8}, 1), empty_kv = random_tensor({0, 2, 8}, 2);
  out = m.forward(ctx, q2.view(), empty_kv.view(), empty_kv.view());
  EXPECT_EQ(out.output.shape(), (Shape{4, 2, 8}));
  MhaInputGrads g = m.backward(ctx, out.output.view());
  EXPECT_EQ(g.key.shape(), (Shape{0, 2, 8}));
}

TEST(MultiheadAttention, ZeroGateRemovesTheHeadsContribution) {
  ThreadContext ctx(1);
  auto c = config(8, 2);
  c.bias = false;
  MultiheadAttention m(c, 3);
  Tensor x = random_tensor({4, 1, 8}, 1);
  m.head_gates().at(0, 1) = 0.0f;
  MhaOutput gated = m.forward(ctx, x.view(), x.view(), x.view());
  // The same as zeroing the columns of out_proj.weight that read head 1.
  m.head_gates().at(0, 1) = 1.0f;
  for (int64_t o = 0; o < 8; ++o)
    for (int64_t e = 4; e < 8; ++e) m.parameter("out_proj.weight").data()[o * 8 + e] = 0.0f;
  MhaOutput pruned = m.forward(ctx, x.view(), x.view(), x.view());
  for (int64_t i = 0; i < gated.output.numel(); ++i)
    EXPECT_NEAR(gated.output.data()[i], pruned.output.data()[i], 1e-6);
}

TEST(MultiheadAttention, GateAndParameterGradientsMatchFiniteDifferences) {
  ThreadContext ctx(1);
  auto c = config(6, 3);
  c.num_kv_heads = 1;
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  c.batch_first = true;
  MultiheadAttention m(c, 5);
  m.set_training(false);
  Tensor q = random_tensor({2, 3, 6}, 1), k = random_tensor({2, 4, 6}, 2),
         v = random_tensor({2, 4, 6}, 3);
  Tensor go = random_tensor({2, 3, 6}, 4);
  m.head_gates().at(0, 0) = 0.7f;
  auto loss = [&] {
    MhaOutput o = m.forward(ctx, q.view(), k.view(), v.view());
    double l = 0;
    for (int64_t i = 0; i < o.output.numel(); ++i) l += double(o.output.data()[i]) * go.data()[i];
    return l;
  };
  loss();
  MhaInputGrads g = m.backward(ctx, go.view());
  auto check_fd = [&](float* x, double analytic, const std::string& what) {
    const float saved = *x;
    const float hi = saved + 1e-2f, lo = saved - 1e-2f;
    *x = hi;
    const double lp = loss();
    *x = lo;
    const double lm = loss();
    *x = saved;
    const double fd = (lp - lm) / (double(hi) - double(lo));
    EXPECT_NEAR(analytic, fd, 2e-3 * (1 + std::fabs(fd))) << what;
  };
  const std::vector<float> gates_grad(m.head_gates().grads(), m.head_gates().grads() + 3);
  for (int h = 0; h < 3; ++h) check_fd(m.head_gates().values() + h, gates_grad[h], "gate");
  for (const std::string& name : m.parameter_names()) {
    Tensor grad = contiguous_copy(m.grad(name).view());
    for (int64_t i = 0; i < grad.numel(); i += 3)
      check_fd(m.parameter(name).data() + i, grad.data()[i], name);
  }
  for (int64_t i = 0; i < q.numel(); i += 5) check_fd(q.data() + i, g.query.data()[i], "query");
  for (int64_t i = 0; i < k.numel(); i += 5) check_fd(k.data() + i, g.key.data()[i], "key");
  for (int64_t i = 0; i < v.numel(); i += 5) check_fd(v.data() + i, g.value.data()[i], "value");
}

TEST(MultiheadAttention, DropoutOnlyInTrainingAndSeeded) {
  ThreadContext ctx(1);
  auto c = config(8, 2);
  c.dropout = 0.5f;
  MultiheadAttention a(c, 1), b(c, 1);
  Tensor x = random_tensor({6, 1, 8}, 1);
  MhaOutput ta = a.forward(ctx, x.view(), x.view(), x.view());
  MhaOutput tb = b.forward(ctx, x.view(), x.view(), x.view());
  int zeros = 0;
  for (int64_t i = 0; i < ta.weights.numel(); ++i) {
    EXPECT_EQ(ta.weights.data()[i], tb.weights.data()[i]);  // same seed, same mask
    zeros += ta.weights.data()[i] == 0.0f;
  }
  EXPECT_GT(zeros, 0);
  a.set_training(false);
  MhaOutput e = a.forward(ctx, x.view(), x.view(), x.view());
  for (int64_t i = 0; i < e.weights.numel(); ++i) EXPECT_GT(e.weights.data()[i], 0.0f);
}

}  // namespace
}  // namespace headlight::attention

// The per-row layers against double-precision loops and central differences: layer/RMS norm,
// GELU, embeddings and cross-entropy, forward and backward; and their thread-count determinism.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/ops/layers.h"
#include "headlight/ops/matmul.h"
#include "test_util.h"

namespace headlight::ops {
namespace {

using testing::random_tensor;

// y of the norm in double, for one row.
std::vector<double> norm_row(NormKind kind, const float* x, const float* w, const float* b,
                             int64_t n, double eps = 1e-5) {
  double mean = 0, var = 0;
  if (kind == NormKind::layer_norm) {
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= static_cast<double>(n);
  }
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const double rstd = 1.0 / std::sqrt(var / static_cast<double>(n) + eps);
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * w[i] + (b ? b[i] : 0.0);
  return y;
}

class NormTest : public ::testing::TestWithParam<NormKind> {};

TEST(ColumnSums, BitForBitThePlainRowOrderLoop) {
  // The bias gradient's column sums: SIMD across columns, each column in row order in double, so
  // the same bits as the plain loop, for widths around every vector length and around the eight
  // vectors of one pass, and a padded stride.
  for (int64_t cols : {1, 3, 7, 8, 9, 16, 37, 64, 71, 130}) {
    const int64_t rows = 53, ld = cols + 5;
    const Tensor x = random_tensor({rows, ld}, static_cast<uint64_t>(cols));
    std::vector<double> got(static_cast<size_t>(cols), 0.25), want(got);
    add_column_sums(x.data(), ld, rows, cols, got.data());
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t r = 0; r < rows; ++r) want[static_cast<size_t>(j)] += x.data()[r * ld + j];
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_EQ(got[static_cast<size_t>(j)], want[static_cast<size_t>(j)]) << cols << " " << j;
  }
}

TEST_P(NormTest, ForwardAndBackwardMatchDoubleAndFiniteDifferences) {
  const NormKind kind = GetParam();
  const int64_t rows = 37, cols = 45;
  Tensor x = random_tensor({rows, cols}, 1), w = random_tensor({cols}, 2),
         b = random_tensor({cols}, 3);
  Tensor dy = random_tensor({rows, cols}, 4);
  const float* bias = kind == NormKind::layer_norm ? b.data() : nullptr;
  ThreadContext ctx(2);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows);
  const NormShape s{kind, rows, cols};
  norm_forward(ctx, s, x.data(), w.data(), bias, y.data(), mean.data(), rstd.data());
  for (int64_t r = 0; r < rows; ++r) {
    const auto want = norm_row(kind, x.data() + r * cols, w.data(), bias, cols);
    for (int64_t c = 0; c < cols; ++c) ASSERT_NEAR(y[r * cols + c], want[c], 1e-5);
  }
  std::vector<float> dx(rows * cols), dw(cols, 0.0f), db(cols, 0.0f);
  norm_backward(ctx, s, x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                {dx.data(), false, dw.data(), bias ? db.data() : nullptr});
  // L = Σ dy ⊙ y; central differences in x (a few entries) and w.
  auto loss = [&](const float* xx, const float* ww) {
    double l = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const auto yr = norm_row(kind, xx + r * cols, ww, bias, cols);
      for (int64_t c = 0; c < cols; ++c) l += dy.data()[r * cols + c] * yr[c];
    }
    return l;
  };
  const float h = 1e-2f;
  for (int64_t i : {int64_t{0}, int64_t{17}, int64_t{300}, rows * cols - 1}) {
    std::vector<float> xp(x.data(), x.data() + rows * cols), xm = xp;
    xp[i] += h;
    xm[i] -= h;
    EXPECT_NEAR(dx[i], (loss(xp.data(), w.data()) - loss(xm.data(), w.data())) / (2 * h), 2e-3);
  }
  for (int64_t c : {int64_t{0}, int64_t{20}, cols - 1}) {
    std::vector<float> wp(w.data(), w.data() + cols), wm = wp;
    wp[c] += h;
    wm[c] -= h;
    EXPECT_NEAR(dw[c], (loss(x.data(), wp.data()) - loss(x.data(), wm.data())) / (2 * h), 2e-3);
  }
  if (bias) {
    double want = 0;
    for (int64_t r = 0; r < rows; ++r) want += dy.data()[r * cols + 3];
    EXPECT_NEAR(db[3], want, 1e-4);
  }
  // The same bits with one thread.
  ThreadContext one(1);
  std::vector<float> dx1(rows * cols), dw1(cols, 0.0f), db1(cols, 0.0f);
  norm_backward(one, s, x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                {dx1.data(), false, dw1.data(), bias ? db1.data() : nullptr});
  EXPECT_EQ(dx, dx1);
  EXPECT_EQ(dw, dw1);
}

TEST_P(NormTest, Bf16OutputIsTheRoundedFloat32Output) {
  // norm_forward_bf16 writes the bits of to_bf16 applied to norm_forward's output, and the same
  // statistics, on every target (odd widths: a tail past the vector length; values scaled to
  // reach bf16's rounding ties and, in one row, denormal outputs).
  const NormKind kind = GetParam();
  const float* none = nullptr;
  for (int64_t cols : {1, 45, 200}) {
    const int64_t rows = 29;
    Tensor x = random_tensor({rows, cols}, 5), w = random_tensor({cols}, 6),
           b = random_tensor({cols}, 7);
    for (int64_t c = 0; c < cols; ++c) w.data()[c] *= c % 7 == 0 ? 1e-39f : 3.0f;
    const float* bias = kind == NormKind::layer_norm ? b.data() : none;
    const NormShape s{kind, rows, cols};
    for (const char* isa : {"best", "avx2", "scalar"}) {
      SCOPED_TRACE(::testing::Message() << isa << " cols " << cols);
      force_isa(isa);
      ThreadContext ctx(2);
      std::vector<float> y(rows * cols), mean(rows), rstd(rows), mean16(rows), rstd16(rows);
      std::vector<bf16> y16(rows * cols);
      norm_forward(ctx, s, x.data(), w.data(), bias, y.data(), mean.data(), rstd.data());
      norm_forward_bf16(ctx, s, x.data(), w.data(), bias, y16.data(), mean16.data(), rstd16.data());
      for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(to_bf16(y[i]).bits, y16[i].bits) << i;
      ASSERT_EQ(rstd, rstd16);
      if (kind == NormKind::layer_norm) {
        ASSERT_EQ(mean, mean16);
      }
    }
  }
  force_isa("best");
}

INSTANTIATE_TEST_SUITE_P(Kinds, NormTest,
                         ::testing::Values(NormKind::layer_norm, NormKind::rms_norm));

// Every activation against its formula in double, and its backward against central differences
// of that formula (for SwiGLU, in the gate and in the up half).
class ActivationTest : public ::testing::TestWithParam<Activation> {};

TEST_P(ActivationTest, MatchesItsFormulaAndItsDerivative) {
  const Activation kind = GetParam();
  const int64_t rows = 3, F = 337;  // a tail past the vector length
  const ActivationShape s{.kind = kind, .rows = rows, .width = F};
  const int64_t in_w = s.input_width();
  std::vector<float> x(rows * in_w), y(rows * F), dy(rows * F), dx(rows * in_w);
  for (int64_t i = 0; i < rows * in_w; ++i)
    x[i] = -8.0f + 16.0f * static_cast<float>((i * 37) % (rows * in_w)) / (rows * in_w);
  for (int64_t i = 0; i < rows * F; ++i) dy[i] = 0.5f + 0.001f * static_cast<float>(i % 97);
  ThreadContext ctx(2);
  activation_forward(ctx, s, x.data(), y.data());
  activation_backward(ctx, s, x.data(), dy.data(), dx.data());
  auto f = [&](double v, double up) {
    switch (kind) {
      case Activation::gelu_tanh:
        return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      case Activation::gelu_erf:
        return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      case Activation::relu:
        return v > 0 ? v : 0.0;
      case Activation::swiglu:
        return v / (1 + std::exp(-v)) * up;
    }
    return 0.0;
  };
  const double h = 1e-4;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < F; ++j) {
      const bool glu = kind == Activation::swiglu;
      const double g = x[r * in_w + j], u = glu ? x[r * in_w + F + j] : 1.0;
      const double want = f(g, u), d = dy[r * F + j];
      ASSERT_NEAR(y[r * F + j], want, 3e-6 * std::max(1.0, std::abs(want))) << g;
      if (kind == Activation::relu && std::abs(g) < h) continue;  // the kink
      ASSERT_NEAR(dx[r * in_w + j], d * (f(g + h, u) - f(g - h, u)) / (2 * h),
                  2e-4 * std::max(1.0, std::abs(u)))
          << g;
      if (glu) {
        ASSERT_NEAR(dx[r * in_w + F + j], d * f(g, 1.0), 2e-5 * std::max(1.0, std::abs(g)));
      }
    }
}

// A case of the tests of the passes that keep the derivative: the kind under test, rows × F,
// x over [−9, 9] in a scrambled order, dy in [−1, 1), two threads.
struct KeepingCase {
  KeepingCase(Activation kind, int64_t rows, int64_t F)
      : s{.kind = kind, .rows = rows, .width = F}, x(rows * F), dy(rows * F) {
    const int64_t n = rows * F;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = -9.0f + 18.0f * static_cast<float>((i * 7919) % n) / n;
      dy[i] = -1.0f + 0.002f * static_cast<float>(i % 1009);
    }
  }
  ActivationShape s;
  std::vector<float> x, dy;
  ThreadContext ctx{2};
};

// Each call throws an Error that names `kind` (a kind that keeps no derivative).
void expect_refused_by_name(Activation kind, std::initializer_list<std::function<void()>> calls) {
  for (const auto& call : calls) {
    try {
      call();
      ADD_FAILURE() << "no error for " << activation_name(kind);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(activation_name(kind)), std::string::npos) << e.what();
    }
  }
}

// The training pass that keeps the derivative gives activation_forward's values and
// activation_backward's gradients bit for bit (so training is the same with either), on every
// target; the kinds that keep none are refused by name.
TEST_P(ActivationTest, KeepingTheDerivativeGivesTheSameBits) {
  const Activation kind = GetParam();
  const int64_t rows = 5, F = 4099;  // several parallel blocks, a tail past the vector length
  KeepingCase c(kind, rows, F);
  if (!activation_keeps_grad(kind)) {
    std::vector<float> y(rows * F);
    expect_refused_by_name(
        kind,
        {[&] { activation_forward_keeping_grad(c.ctx, c.s, c.x.data(), y.data()); },
         [&] { activation_backward_from_grad(c.ctx, c.s, c.x.data(), c.dy.data(), y.data()); }});
    return;
  }
  for (const char* isa : {"best", "avx2", "scalar"}) {
    SCOPED_TRACE(isa);
    force_isa(isa);
    std::vector<float> y(rows * F), dx(rows * F), kept = c.x, y2(rows * F), dx2(rows * F);
    activation_forward(c.ctx, c.s, c.x.data(), y.data());
    activation_backward(c.ctx, c.s, c.x.data(), c.dy.data(), dx.data());
    activation_forward_keeping_grad(c.ctx, c.s, kept.data(), y2.data());
    activation_backward_from_grad(c.ctx, c.s, kept.data(), c.dy.data(), dx2.data());
    ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)));
    ASSERT_EQ(0, std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(float)));
  }
  force_isa("best");
}

// Mixed precision's forward gives the same values rounded to bf16 and the same derivative, on
// every target. The kinds that keep no derivative are refused by name.
TEST_P(ActivationTest, MixedPrecisionForwardRoundsTheSameValues) {
  const Activation kind = GetParam();
  const int64_t rows = 131, F = 77;  // several row chunks, a tail past the vector length
  KeepingCase c(kind, rows, F);
  std::vector<bf16> out16(rows * F);
  if (!activation_keeps_grad(kind)) {
    expect_refused_by_name(
        kind,
        {[&] { activation_forward_keeping_grad_bf16(c.ctx, c.s, c.x.data(), out16.data()); }});
    return;
  }
  for (const char* isa : {"best", "avx2", "scalar"}) {
    SCOPED_TRACE(isa);
    force_isa(isa);
    std::vector<float> y(rows * F), kept = c.x, kept16 = c.x;
    activation_forward_keeping_grad(c.ctx, c.s, kept.data(), y.data());
    activation_forward_keeping_grad_bf16(c.ctx, c.s, kept16.data(), out16.data());
    ASSERT_EQ(0, std::memcmp(kept.data(), kept16.data(), kept.size() * sizeof(float)));
    for (int64_t i = 0; i < rows * F; ++i) ASSERT_EQ(to_bf16(y[i]).bits, out16[i].bits) << i;
  }
  force_isa("best");
}

INSTANTIATE_TEST_SUITE_P(Kinds, ActivationTest,
                         ::testing::Values(Activation::gelu_tanh, Activation::gelu_erf,
                                           Activation::relu, Activation::swiglu),
                         [](const auto& info) { return std::string(activation_name(info.param)); });

TEST(RoundWithColumnSums, RoundsAsToBf16AndAddsTheColumnSums) {
  // 75 rows (two whole chunks of 32 and a part), 45 columns: y is to_bf16 of x, bias gains the
  // column sums (as linear_backward's, to the double sums' rounding), the same bits on 1 thread.
  const int64_t rows = 75, cols = 45;
  Tensor x = random_tensor({rows, cols}, 4);
  ThreadContext ctx(2), one(1);
  std::vector<bf16> y(rows * cols), y1(rows * cols);
  std::vector<float> bias(cols, 0.25f), bias1(cols, 0.25f), ref(cols, 0.25f);
  round_with_column_sums(ctx, rows, cols, x.data(), y.data(), bias.data());
  round_with_column_sums(one, rows, cols, x.data(), y1.data(), bias1.data());
  linear_backward(ctx, {.rows = rows, .in_features = 1, .out_features = cols}, nullptr, 1, nullptr,
                  x.data(), cols, {nullptr, 0, nullptr, ref.data(), true});
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(y[i].bits, to_bf16(x.data()[i]).bits) << i;
    ASSERT_EQ(y1[i].bits, y[i].bits) << i;
  }
  for (int64_t j = 0; j < cols; ++j) {
    EXPECT_NEAR(bias[j], ref[j], 1e-6 * std::max(1.0f, std::abs(ref[j]))) << j;
    EXPECT_NE(bias[j], 0.25f) << j;  // the sums were added
    EXPECT_EQ(bias1[j], bias[j]) << j;
  }
}

TEST(AddColumnSums, Bf16RowsSumAsRoundWithColumnSumsDoes) {
  // The column sums of bf16 rows are round_with_column_sums's sums of the same (rounded) values,
  // bit for bit, on 1, 2 and 3 threads, and within double rounding of a plain double loop; every
  // shape of columns (a vector's, eight vectors', tails) and chunks of rows (a part, whole, more).
  for (const int64_t rows : {int64_t{1}, int64_t{32}, int64_t{75}})
    for (const int64_t cols : {int64_t{1}, int64_t{45}, int64_t{64}, int64_t{130}}) {
      Tensor x = random_tensor({rows, cols}, 5);
      std::vector<bf16> x16(static_cast<size_t>(rows * cols));
      to_bf16(x.data(), x16.data(), x16.size());
      std::vector<float> rounded(x16.size());  // the bf16 values as floats
      for (size_t i = 0; i < x16.size(); ++i) rounded[i] = to_float(x16[i]);
      std::vector<bf16> unused(x16.size());
      std::vector<float> want(static_cast<size_t>(cols), 0.5f);
      ThreadContext two(2);
      round_with_column_sums(two, rows, cols, rounded.data(), unused.data(), want.data());
      for (const int threads : {1, 2, 3}) {
        ThreadContext ctx(threads);
        std::vector<float> got(static_cast<size_t>(cols), 0.5f);
        add_column_sums(ctx, rows, cols, x16.data(), got.data());
        for (int64_t j = 0; j < cols; ++j) {
          double plain = 0;
          for (int64_t r = 0; r < rows; ++r) plain += rounded[r * cols + j];
          ASSERT_EQ(got[j], want[j]) << rows << "x" << cols << " column " << j << " on " << threads;
          ASSERT_NEAR(got[j], 0.5 + plain, 1e-6 * std::max(1.0, std::abs(plain)));
        }
      }
    }
}

TEST(CrossEntropy, MeanOverCountedRowsAndItsGradient) {
  const int64_t rows = 41, vocab = 67;
  Tensor logits = random_tensor({rows, vocab}, 9);
  for (int64_t i = 0; i < rows * vocab; ++i) logits.data()[i] *= 5.0f;
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r)
    targets[r] = r % 5 == 0 ? -1 : static_cast<int32_t>((r * 7) % vocab);
  ThreadContext ctx(2);
  std::vector<float> d(rows * vocab);
  const double loss = cross_entropy(ctx, {rows, vocab}, logits.data(), targets.data(), d.data());
  double want = 0;
  int counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    const float* row = logits.data() + r * vocab;
    double m = row[0], s = 0;
    for (int64_t c = 0; c < vocab; ++c) m = std::max(m, static_cast<double>(row[c]));
    for (int64_t c = 0; c < vocab; ++c) s += std::exp(row[c] - m);
    want += m + std::log(s) - row[targets[r]];
    ++counted;
    for (int64_t c = 0; c < vocab; ++c) {
      const double p = std::exp(row[c] - m) / s - (c == targets[r] ? 1.0 : 0.0);
      ASSERT_NEAR(d[r * vocab + c], p / 32.0, 1e-6);  // 32 of the 41 rows count
    }
  }
  EXPECT_NEAR(loss, want / counted, 1e-5);
  for (int64_t c = 0; c < vocab; ++c) EXPECT_EQ(d[0 * vocab + c], 0.0f);  // an ignored row
  testing::expect_error(
      [&] {
        targets[3] = static_cast<int32_t>(vocab);
        cross_entropy(ctx, {rows, vocab}, logits.data(), targets.data(), nullptr);
      },
      {"targets: id 67 at position 3"});
}

TEST(Embedding, GathersAndScattersInOrder) {
  const int64_t T = 5, B = 2, dim = 3, vocab = 4;
  const std::vector<int32_t> tokens = {0, 3, 3, 1, 0, 2, 2, 2, 3, 1};
  Tensor wte = random_tensor({vocab, dim}, 1), pos = random_tensor({T, dim}, 2);
  ThreadContext ctx(2);
  std::vector<float> x(B * T * dim);
  const EmbeddingShape s{B * T, dim, vocab, T};
  embedding_forward(ctx, s, tokens.data(), wte.data(), pos.data(), x.data());
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = 0; c < dim; ++c)
      EXPECT_EQ(x[r * dim + c], wte.data()[tokens[r] * dim + c] + pos.data()[(r % T) * dim + c]);
  std::vector<float> dwte(vocab * dim, 0.0f), dpos(T * dim, 0.0f);
  std::vector<float> ones(B * T * dim, 1.0f);
  embedding_backward(ctx, s, tokens.data(), ones.data(), dwte.data(), dpos.data());
  EXPECT_EQ(dwte[3 * dim], 3.0f);  // token 3 appears three times
  EXPECT_EQ(dwte[2 * dim], 3.0f);
  EXPECT_EQ(dpos[0], 2.0f);  // each position once per sequence
  const std::vector<int32_t> bad = {0, 4};
  testing::expect_error(
      [&] {
        embedding_forward(ctx, {2, dim, vocab, 2}, bad.data(), wte.data(), nullptr, x.data());
      },
      {"tokens: id 4 at position 1"});
}

}  // namespace
}  // namespace headlight::ops

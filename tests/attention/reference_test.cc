// The reference attention against hand-computed cases, an independent dense-matrix formula, and
// central finite differences, over every option.

#include "headlight/attention/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "attention_test_util.h"
#include "headlight/core/error.h"

namespace headlight::attention {
namespace {

using testing::CaseData;
using testing::option_cases;
using testing::OptionCase;
using testing::Problem;
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ReferenceForward, HandComputedTwoKeys) {
  // q = [1], keys [1] and [0], values [1] and [3], scale 1: P = [e, 1] / (e + 1).
  Problem pr({.batch = 1,
              .heads = 1,
              .kv_heads = 1,
              .len_q = 1,
              .len_kv = 2,
              .head_dim = 1,
              .value_dim = 1});
  pr.q = {1};
  pr.k = {1, 0};
  pr.v = {1, 3};
  AttentionOptions o;
  o.scale = 1.0f;
  reference::forward(pr.params(o));
  const double e = std::exp(1.0);
  EXPECT_NEAR(pr.out[0], (e + 3) / (e + 1), 1e-6);
  EXPECT_NEAR(pr.lse[0], std::log(e + 1), 1e-6);
  EXPECT_NEAR(pr.probs[0], e / (e + 1), 1e-6);
  EXPECT_NEAR(pr.probs[1], 1 / (e + 1), 1e-6);
}

TEST(ReferenceForward, FullyMaskedRowGivesZerosAndMinusInfLse) {
  Problem pr({.batch = 1,
              .heads = 1,
              .kv_heads = 1,
              .len_q = 3,
              .len_kv = 4,
              .head_dim = 2,
              .value_dim = 2});
  AttentionOptions o;
  o.key_lengths = nullptr;
  o.causal = true;
  o.alignment = Alignment::bottom_right;  // query i sees keys j <= i + 1
  o.window_right = 0;
  o.window_left = 0;
  std::vector<uint8_t> mask(3 * 4, 1);
  mask[0 * 4 + 1] = 0;  // query 0 only saw key 1
  o.mask = MaskOperand{.kind = MaskKind::boolean, .data = mask.data(), .row_stride = 4};
  reference::forward(pr.params(o));
  EXPECT_EQ(pr.out[0], 0.0f);
  EXPECT_EQ(pr.out[1], 0.0f);
  EXPECT_EQ(pr.lse[0], -std::numeric_limits<float>::infinity());
  for (int j = 0; j < 4; ++j) EXPECT_EQ(pr.probs[j], 0.0f);
  EXPECT_NEAR(pr.probs[1 * 4 + 2], 1.0f, 1e-6);  // query 1 sees only key 2
}

TEST(ReferenceForward, NanStaysInTheAffectedRow) {
  Problem pr({.batch = 1,
              .heads = 2,
              .kv_heads = 2,
              .len_q = 3,
              .len_kv = 5,
              .head_dim = 4,
              .value_dim = 4});
  pr.q[1 * 4 + 2] = std::nanf("");  // batch 0, head 0, row 1
  reference::forward(pr.params());
  for (int e = 0; e < 4; ++e) {
    EXPECT_TRUE(std::isnan(pr.out[1 * 4 + e]));
    EXPECT_FALSE(std::isnan(pr.out[0 * 4 + e]));
    EXPECT_FALSE(std::isnan(pr.out[2 * 4 + e]));
    EXPECT_FALSE(std::isnan(pr.out[3 * 4 + e]));  // head 1
  }
}

// ---------------------------------------------------------------------------------------------
// A sweep of options, checked against a dense-matrix formula written independently of the
// reference's row loop.

// Dense formula: for each (b, h) build S = scale·Q·Kᵀ, the bias and the allowed matrix, then
// P = softmax(S) row by row and O = (P ⊙ keep)·V.
std::vector<double> dense_formula(const AttentionParams& p, std::vector<double>* lse_out) {
  const AttentionShape& s = p.shape;
  const AttentionOptions& o = p.options;
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(s.head_dim));
  std::vector<double> out(static_cast<size_t>(s.batch * s.heads * s.len_q * s.value_dim));
  lse_out->assign(static_cast<size_t>(s.batch * s.heads * s.len_q), 0.0);
  const int64_t shift = o.alignment == Alignment::bottom_right ? s.len_kv - s.len_q : 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h * s.kv_heads / s.heads;
      std::vector<std::vector<double>> S(s.len_q, std::vector<double>(s.len_kv));
      for (int64_t i = 0; i < s.len_q; ++i)
        for (int64_t j = 0; j < s.len_kv; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < s.head_dim; ++e)
            dot += double(p.q.at(b, h, i)[e]) * p.k.at(b, g, j)[e];
          double x = scale * dot;
          if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
          const int64_t dist = std::llabs(i + shift - j);
          if (o.alibi_slopes) x -= o.alibi_slopes[h] * double(dist);
          const auto& m = o.mask;
          const int64_t moff =
              b * m.batch_stride + h * m.head_stride + i * m.row_stride + j * m.col_stride;
          if (m.kind == MaskKind::additive) x += static_cast<const float*>(m.data)[moff];
          const bool lower = j - (i + shift) <= 0;
          bool ok = (!o.causal || lower) &&
                    (o.window_left < 0 || (i + shift) - j <= o.window_left) &&
                    (o.window_right < 0 || j - (i + shift) <= o.window_right) &&
                    (!o.key_lengths || j < o.key_lengths[b]) &&
                    (m.kind != MaskKind::boolean || static_cast<const uint8_t*>(m.data)[moff]);
          S[i][j] = ok ? x : -kInf;
        }
      for (int64_t i = 0; i < s.len_q; ++i) {
        double mx = -kInf;
        for (double x : S[i]) mx = std::max(mx, x);
        double z = 0;
        for (double x : S[i]) z += mx == -kInf ? 0 : std::exp(x - mx);
        (*lse_out)[(b * s.heads + h) * s.len_q + i] = mx == -kInf ? -kInf : mx + std::log(z);
        for (int64_t j = 0; j < s.len_kv; ++j) {
          double pij = mx == -kInf ? 0 : std::exp(S[i][j] - mx) / z;
          if (o.dropout_p > 0) {
            const CounterRng rng(o.dropout_seed);
            const uint64_t idx = uint64_t(((b * s.heads + h) * s.len_q + i) * s.len_kv + j);
            pij = rng.uniform(idx) >= o.dropout_p ? pij / (1 - o.dropout_p) : 0;
          }
          for (int64_t e = 0; e < s.value_dim; ++e)
            out[((b * s.heads + h) * s.len_q + i) * s.value_dim + e] += pij * p.v.at(b, g, j)[e];
        }
      }
    }
  return out;
}

TEST(ReferenceForward, MatchesDenseFormulaForEveryOption) {
  for (const OptionCase& c : option_cases()) {
    SCOPED_TRACE(c.name);
    Problem pr(c.shape, 11);
    CaseData data;
    c.setup(data);
    const AttentionOptions& o = data.options;
    AttentionParams p = pr.params(o);
    reference::forward(p);
    std::vector<double> lse;
    std::vector<double> expect = dense_formula(p, &lse);
    for (size_t i = 0; i < expect.size(); ++i) ASSERT_NEAR(pr.out[i], expect[i], 2e-6) << i;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (lse[i] == -kInf) {
        ASSERT_EQ(pr.lse[i], -std::numeric_limits<float>::infinity());
      } else {
        ASSERT_NEAR(pr.lse[i], lse[i], 2e-6) << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gradients against central differences of L = Σ out ⊙ dout.

double loss(Problem& pr, const AttentionOptions& o) {
  reference::forward(pr.params(o));
  double l = 0;
  for (size_t i = 0; i < pr.out.size(); ++i) l += double(pr.out[i]) * pr.dout[i];
  return l;
}

void check_gradient(Problem& pr, const AttentionOptions& o, std::vector<float>& x,
                    const std::vector<float>& grad, const char* what) {
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    const float hi = saved + 1e-3f, lo = saved - 1e-3f;
    x[i] = hi;
    const double lp = loss(pr, o);
    x[i] = lo;
    const double lm = loss(pr, o);
    x[i] = saved;
    const double fd = (lp - lm) / (double(hi) - double(lo));
    ASSERT_NEAR(grad[i], fd, 2e-3 * (1 + std::fabs(fd))) << what << "[" << i << "]";
  }
}

TEST(ReferenceBackward, MatchesFiniteDifferencesForEveryOption) {
  for (const OptionCase& c : option_cases()) {
    SCOPED_TRACE(c.name);
    Problem pr(c.shape, 23);
    CaseData data;
    c.setup(data);
    const AttentionOptions& o = data.options;
    reference::backward(pr.params(o));
    const std::vector<float> dq = pr.dq, dk = pr.dk, dv = pr.dv;
    check_gradient(pr, o, pr.q, dq, "dq");
    check_gradient(pr, o, pr.k, dk, "dk");
    check_gradient(pr, o, pr.v, dv, "dv");
  }
}

TEST(ReferenceBackward, FullyMaskedRowsHaveZeroGradients) {
  Problem pr({.batch = 1,
              .heads = 1,
              .kv_heads = 1,
              .len_q = 2,
              .len_kv = 3,
              .head_dim = 2,
              .value_dim = 2});
  std::vector<int64_t> lens = {0};
  AttentionOptions o;
  o.key_lengths = lens.data();
  reference::backward(pr.params(o));
  for (float x : pr.dq) EXPECT_EQ(x, 0.0f);
  for (float x : pr.dk) EXPECT_EQ(x, 0.0f);
  for (float x : pr.dv) EXPECT_EQ(x, 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Bad parameters.

TEST(ReferenceParams, RejectsInconsistentShapesAndOptions) {
  Problem pr({.batch = 1,
              .heads = 4,
              .kv_heads = 3,
              .len_q = 2,
              .len_kv = 2,
              .head_dim = 2,
              .value_dim = 2});
  EXPECT_THROW(reference::forward(pr.params()), Error);  // 3 kv heads do not divide 4
  Problem ok({.batch = 1,
              .heads = 2,
              .kv_heads = 1,
              .len_q = 2,
              .len_kv = 2,
              .head_dim = 2,
              .value_dim = 2});
  AttentionOptions o;
  o.scale = std::numeric_limits<float>::infinity();
  EXPECT_THROW(reference::forward(ok.params(o)), Error);
  o = {};
  o.dropout_p = 1.0f;
  EXPECT_THROW(reference::forward(ok.params(o)), Error);
  o = {};
  o.softcap = -1.0f;
  EXPECT_THROW(reference::forward(ok.params(o)), Error);
  try {
    reference::forward(pr.params());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads (3)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace headlight::attention

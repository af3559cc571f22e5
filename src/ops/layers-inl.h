// Per-target SIMD loops of layers.cc: the activations (GELU in tanh and erf form, SwiGLU) and
// their derivatives, a norm's row, and a row's log-sum-exp with its softmax. Each has a scalar tail
// for the last n mod lanes elements.

#if defined(HEADLIGHT_OPS_LAYERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADLIGHT_OPS_LAYERS_INL_H_
#undef HEADLIGHT_OPS_LAYERS_INL_H_
#else
#define HEADLIGHT_OPS_LAYERS_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "headlight/core/bf16.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr float kGeluC = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluA = 0.044715f;

// erf(x) by Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7): with t = 1/(1 + p|x|),
// erf(|x|) = 1 − t(a1 + t(a2 + t(a3 + t(a4 + t·a5))))·e^(−x²), the sign restored after.
template <class D, class V>
HWY_INLINE V ErfApprox(D d, V x) {
  const auto ax = hn::Abs(x);
  const auto t =
      hn::Div(hn::Set(d, 1.0f), hn::MulAdd(hn::Set(d, 0.3275911f), ax, hn::Set(d, 1.0f)));
  auto poly = hn::Set(d, 1.061405429f);
  poly = hn::MulAdd(poly, t, hn::Set(d, -1.453152027f));
  poly = hn::MulAdd(poly, t, hn::Set(d, 1.421413741f));
  poly = hn::MulAdd(poly, t, hn::Set(d, -0.284496736f));
  poly = hn::MulAdd(poly, t, hn::Set(d, 0.254829592f));
  poly = hn::Mul(poly, t);
  const auto e = hn::Exp(d, hn::Neg(hn::Mul(ax, ax)));
  const auto r = hn::NegMulAdd(poly, e, hn::Set(d, 1.0f));
  return hn::CopySign(r, x);
}

constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// The two forms of GELU, each as the evaluation its value and derivative share (Arg, of a vector)
// and how each is made from it, and the same in scalars (for tails):
//   tanh: y = ½x(1 + t), t = tanh(c(x + a x³)) (GPT-2's);
//         y' = ½(1 + t) + ½x(1 − t²)·c(1 + 3a x²)
//   erf:  y = ½x(1 + e), e = erf(x/√2) (BERT's "gelu"); y' = ½(1 + e) + x·φ(x), φ the standard
//         normal density
// Every pass builds a value or derivative from these same operations, so it has the same bits
// whether the forward, the backward or the forward that keeps the derivative computed it.
struct GeluTanhForm {
  template <class D, class V>
  static HWY_INLINE V Arg(D d, V v) {
    return hn::Tanh(d, hn::Mul(hn::Set(d, kGeluC),
                               hn::MulAdd(hn::Mul(hn::Set(d, kGeluA), hn::Mul(v, v)), v, v)));
  }
  template <class D, class V>
  static HWY_INLINE V Value(D d, V v, V t) {
    return hn::Mul(hn::Mul(hn::Set(d, 0.5f), v), hn::Add(hn::Set(d, 1.0f), t));
  }
  template <class D, class V>
  static HWY_INLINE V Grad(D d, V v, V t) {
    const auto half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f);
    const auto sech2 = hn::NegMulAdd(t, t, one);
    const auto inner_grad =
        hn::Mul(hn::Set(d, kGeluC), hn::MulAdd(hn::Set(d, 3.0f * kGeluA), hn::Mul(v, v), one));
    return hn::MulAdd(hn::Mul(hn::Mul(half, v), sech2), inner_grad, hn::Mul(half, hn::Add(one, t)));
  }
  static float Value(float x) {
    return 0.5f * x * (1.0f + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
  }
  static float Grad(float x) {
    const float t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  }
};

struct GeluErfForm {
  template <class D, class V>
  static HWY_INLINE V Arg(D d, V v) {
    return ErfApprox(d, hn::Mul(v, hn::Set(d, kInvSqrt2)));
  }
  template <class D, class V>
  static HWY_INLINE V Value(D d, V v, V e) {
    return hn::Mul(hn::Mul(hn::Set(d, 0.5f), v), hn::Add(hn::Set(d, 1.0f), e));
  }
  template <class D, class V>
  static HWY_INLINE V Grad(D d, V v, V e) {
    const auto cdf = hn::Mul(hn::Set(d, 0.5f), hn::Add(hn::Set(d, 1.0f), e));
    const auto pdf =
        hn::Mul(hn::Set(d, kInvSqrt2Pi), hn::Exp(d, hn::Mul(hn::Set(d, -0.5f), hn::Mul(v, v))));
    return hn::MulAdd(v, pdf, cdf);
  }
  static float Value(float x) { return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2)); }
  static float Grad(float x) {
    const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    return cdf + x * pdf;
  }
};

// y = gelu(x).
template <class Form>
inline void GeluForward(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(Form::Value(d, v, Form::Arg(d, v)), d, y + i);
  }
  for (; i < n; ++i) y[i] = Form::Value(x[i]);
}

// dx = gelu'(x) ⊙ dy.
template <class Form>
inline void GeluBackward(const float* HWY_RESTRICT x, const float* dy, float* dx, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(hn::Mul(Form::Grad(d, v, Form::Arg(d, v)), hn::LoadU(d, dy + i)), d, dx + i);
  }
  for (; i < n; ++i) dx[i] = Form::Grad(x[i]) * dy[i];
}

// GeluForward and, in place of x, the derivative GeluBackward multiplies dy by: one evaluation
// (tanh or erf) for both.
template <class Form>
inline void GeluForwardKeepingGrad(float* HWY_RESTRICT x_then_grad, float* HWY_RESTRICT y,
                                   int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x_then_grad + i);
    const auto a = Form::Arg(d, v);
    hn::StoreU(Form::Value(d, v, a), d, y + i);
    hn::StoreU(Form::Grad(d, v, a), d, x_then_grad + i);
  }
  for (; i < n; ++i) {
    y[i] = Form::Value(x_then_grad[i]);
    x_then_grad[i] = Form::Grad(x_then_grad[i]);
  }
}

// dx = g ⊙ dy: the backward of an activation whose derivative g the forward kept.
inline void MulElements(const float* HWY_RESTRICT g, const float* dy, float* dx, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, g + i), hn::LoadU(d, dy + i)), d, dx + i);
  for (; i < n; ++i) dx[i] = g[i] * dy[i];
}

// SwiGLU over one row: y[j] = silu(gate[j])·up[j], silu(g) = g·σ(g).
inline void SwigluForward(const float* HWY_RESTRICT gate, const float* HWY_RESTRICT up,
                          float* HWY_RESTRICT y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto g = hn::LoadU(d, gate + i);
    const auto sig = hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(g))));
    hn::StoreU(hn::Mul(hn::Mul(g, sig), hn::LoadU(d, up + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// Its gradients: dgate = dy·up·σ(g)(1 + g(1 − σ(g))), dup = dy·silu(g).
inline void SwigluBackward(const float* HWY_RESTRICT gate, const float* HWY_RESTRICT up,
                           const float* HWY_RESTRICT dy, float* HWY_RESTRICT dgate,
                           float* HWY_RESTRICT dup, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto g = hn::LoadU(d, gate + i), u = hn::LoadU(d, up + i), dv = hn::LoadU(d, dy + i);
    const auto sig = hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(g))));
    const auto dsilu = hn::Mul(sig, hn::MulAdd(g, hn::Sub(one, sig), one));
    hn::StoreU(hn::Mul(hn::Mul(dv, u), dsilu), d, dgate + i);
    hn::StoreU(hn::Mul(dv, hn::Mul(g, sig)), d, dup + i);
  }
  for (; i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-gate[i]));
    dgate[i] = dy[i] * up[i] * sig * (1.0f + gate[i] * (1.0f - sig));
    dup[i] = dy[i] * gate[i] * sig;
  }
}

// One row of a norm (layer: subtract the mean; RMS: no mean): y = (x − μ)·rstd·w + b (b may be
// null). Returns rstd and writes μ. Sums in float vectors, the mean first, then the centred
// squares.
inline float NormRow(const float* HWY_RESTRICT x, const float* HWY_RESTRICT w,
                     const float* HWY_RESTRICT b, float* HWY_RESTRICT y, int64_t n, bool center,
                     float eps, float* mean_out) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  float mean = 0.0f;
  int64_t i = 0;
  if (center) {
    auto acc = hn::Zero(d);
    double tail = 0.0;
    for (; i + L <= n; i += L) acc = hn::Add(acc, hn::LoadU(d, x + i));
    for (; i < n; ++i) tail += x[i];
    mean =
        static_cast<float>((hn::GetLane(hn::SumOfLanes(d, acc)) + tail) / static_cast<double>(n));
  }
  const auto vm = hn::Set(d, mean);
  auto sq = hn::Zero(d);
  double tail = 0.0;
  for (i = 0; i + L <= n; i += L) {
    const auto t = hn::Sub(hn::LoadU(d, x + i), vm);
    sq = hn::MulAdd(t, t, sq);
  }
  for (; i < n; ++i) tail += static_cast<double>(x[i] - mean) * (x[i] - mean);
  const double var = (hn::GetLane(hn::SumOfLanes(d, sq)) + tail) / static_cast<double>(n);
  const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
  const auto vr = hn::Set(d, rstd);
  for (i = 0; i + L <= n; i += L) {
    auto v = hn::Mul(hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr), hn::LoadU(d, w + i));
    if (b) v = hn::Add(v, hn::LoadU(d, b + i));
    hn::StoreU(v, d, y + i);
  }
  for (; i < n; ++i) y[i] = (x[i] - mean) * rstd * w[i] + (b ? b[i] : 0.0f);
  *mean_out = mean;
  return rstd;
}

// The backward of one norm row: with x̂ = (x − μ)·rstd and g = dy ⊙ w,
//   dx = rstd · (g − mean(g)·[center] − x̂ · mean(g ⊙ x̂))   (stored, or added when accumulate)
//   pw += dy ⊙ x̂,  pb += dy                                  (when pw is non-null)
inline void NormRowBackward(const float* HWY_RESTRICT x, const float* HWY_RESTRICT w,
                            const float* HWY_RESTRICT dy, float mean, float rstd, int64_t n,
                            bool center, float* dx, bool accumulate, float* pw, float* pb) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto vm = hn::Set(d, mean), vr = hn::Set(d, rstd);
  auto sg = hn::Zero(d), sgx = hn::Zero(d);
  double tg = 0.0, tgx = 0.0;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto xh = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    const auto dyv = hn::LoadU(d, dy + i);
    const auto g = hn::Mul(dyv, hn::LoadU(d, w + i));
    sg = hn::Add(sg, g);
    sgx = hn::MulAdd(g, xh, sgx);
    if (pw) {
      hn::StoreU(hn::MulAdd(dyv, xh, hn::LoadU(d, pw + i)), d, pw + i);
      hn::StoreU(hn::Add(dyv, hn::LoadU(d, pb + i)), d, pb + i);
    }
  }
  for (; i < n; ++i) {
    const float xh = (x[i] - mean) * rstd, g = dy[i] * w[i];
    tg += g;
    tgx += static_cast<double>(g) * xh;
    if (pw) {
      pw[i] += dy[i] * xh;
      pb[i] += dy[i];
    }
  }
  if (!dx) return;
  const float mg =
      center ? static_cast<float>((hn::GetLane(hn::SumOfLanes(d, sg)) + tg) / n) : 0.0f;
  const float mgx = static_cast<float>((hn::GetLane(hn::SumOfLanes(d, sgx)) + tgx) / n);
  const auto vmg = hn::Set(d, mg), vmgx = hn::Set(d, mgx);
  for (i = 0; i + L <= n; i += L) {
    const auto xh = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    const auto g = hn::Mul(hn::LoadU(d, dy + i), hn::LoadU(d, w + i));
    auto v = hn::Mul(vr, hn::Sub(hn::Sub(g, vmg), hn::Mul(xh, vmgx)));
    if (accumulate) v = hn::Add(v, hn::LoadU(d, dx + i));
    hn::StoreU(v, d, dx + i);
  }
  for (; i < n; ++i) {
    const float xh = (x[i] - mean) * rstd;
    const float v = rstd * (dy[i] * w[i] - mg - xh * mgx);
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

// log Σ exp(x) over a row of n finite floats; with p non-null also p = softmax(x) (p may be x).
inline float RowLogSumExp(const float* x, int64_t n, float* p) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  auto vmax = hn::Set(d, m);
  for (; i + L <= n; i += L) vmax = hn::Max(vmax, hn::LoadU(d, x + i));
  m = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; i < n; ++i) m = std::max(m, x[i]);
  const auto vm = hn::Set(d, m);
  auto vsum = hn::Zero(d);
  double tail = 0.0;
  i = 0;
  for (; i + L <= n; i += L) vsum = hn::Add(vsum, hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vm)));
  for (; i < n; ++i) tail += std::exp(static_cast<double>(x[i] - m));
  const double sum = static_cast<double>(hn::GetLane(hn::SumOfLanes(d, vsum))) + tail;
  const float lse = m + static_cast<float>(std::log(sum));
  if (p) {
    const auto vl = hn::Set(d, lse);
    i = 0;
    for (; i + L <= n; i += L) hn::StoreU(hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vl)), d, p + i);
    for (; i < n; ++i) p[i] = std::exp(x[i] - lse);
  }
  return lse;
}

// sums[j] += Σ_r x[r·ldx + j] for j < cols, each column added in row order in double, as the plain
// loop adds it (so the same bits). Eight vectors of columns at a time, row by row: eight
// independent chains of additions (one chain waits on each addition's latency), and each row's
// columns read as one run of memory (a column at a time over all the rows would read every cache
// line of x once per vector in it, rows apart, from L2 or beyond); then a vector at a time.
// T: float, or bf16 (each value widened exactly).
template <class T>
inline void AddColumnSums(const T* HWY_RESTRICT x, int64_t ldx, int64_t rows, int64_t cols,
                          double* HWY_RESTRICT sums) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(dd));
  auto load = [&](const T* p) {  // L values of p as doubles
    if constexpr (std::is_same_v<T, float>) {
      return hn::PromoteTo(dd, hn::LoadU(df, p));
    } else {
      const hn::Rebind<hwy::bfloat16_t, decltype(df)> db;
      return hn::PromoteTo(
          dd, hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(p))));
    }
  };
  auto value = [](T v) -> double {
    if constexpr (std::is_same_v<T, float>) {
      return v;
    } else {
      return to_float(v);
    }
  };
  int64_t j = 0;
#if !HWY_HAVE_SCALABLE  // sizeless vectors cannot live in arrays
  constexpr int64_t kChains = 8;
  for (; j + kChains * L <= cols; j += kChains * L) {
    hn::Vec<decltype(dd)> acc[kChains];
    for (int64_t v = 0; v < kChains; ++v) acc[v] = hn::LoadU(dd, sums + j + v * L);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * ldx + j;
      for (int64_t v = 0; v < kChains; ++v) acc[v] = hn::Add(acc[v], load(row + v * L));
    }
    for (int64_t v = 0; v < kChains; ++v) hn::StoreU(acc[v], dd, sums + j + v * L);
  }
#endif
  for (; j + L <= cols; j += L) {
    auto acc = hn::LoadU(dd, sums + j);
    for (int64_t r = 0; r < rows; ++r) acc = hn::Add(acc, load(x + r * ldx + j));
    hn::StoreU(acc, dd, sums + j);
  }
  for (; j < cols; ++j)
    for (int64_t r = 0; r < rows; ++r) sums[j] += value(x[r * ldx + j]);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#endif  // include guard

// Helpers for the attention tests: random contiguous operands and AttentionParams over them.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "headlight/attention/params.h"
#include "headlight/core/rng.h"

namespace headlight::attention::testing {

// Contiguous [batch, heads, rows, dim] buffers for one attention problem.
struct Problem {
  AttentionShape shape;
  std::vector<float> q, k, v, out, lse, probs, dout, dq, dk, dv;

  explicit Problem(const AttentionShape& s, uint64_t seed = 1) : shape(s) {
    Generator g(seed);
    auto fill = [&](std::vector<float>& x, int64_t n) {
      x.resize(static_cast<size_t>(n));
      for (auto& e : x) e = g.uniform(-1.0f, 1.0f);
    };
    fill(q, s.batch * s.heads * s.len_q * s.head_dim);
    fill(k, s.batch * s.kv_heads * s.len_kv * s.head_dim);
    fill(v, s.batch * s.kv_heads * s.len_kv * s.value_dim);
    fill(dout, s.batch * s.heads * s.len_q * s.value_dim);
    out.assign(static_cast<size_t>(s.batch * s.heads * s.len_q * s.value_dim), 0.0f);
    lse.assign(static_cast<size_t>(s.batch * s.heads * s.len_q), 0.0f);
    probs.assign(static_cast<size_t>(s.batch * s.heads * s.len_q * s.len_kv), 0.0f);
    dq.assign(q.size(), 0.0f);
    dk.assign(k.size(), 0.0f);
    dv.assign(v.size(), 0.0f);
  }

  static Operand operand(std::vector<float>& x, int64_t heads, int64_t rows, int64_t dim) {
    return Operand{.data = x.data(),
                   .batch_stride = heads * rows * dim,
                   .head_stride = rows * dim,
                   .row_stride = dim};
  }

  AttentionParams params(const AttentionOptions& options = {}) {
    const AttentionShape& s = shape;
    AttentionParams p;
    p.shape = s;
    p.options = options;
    p.q = operand(q, s.heads, s.len_q, s.head_dim);
    p.k = operand(k, s.kv_heads, s.len_kv, s.head_dim);
    p.v = operand(v, s.kv_heads, s.len_kv, s.value_dim);
    p.out = operand(out, s.heads, s.len_q, s.value_dim);
    p.lse = lse.data();
    p.probs = probs.data();
    p.dout = operand(dout, s.heads, s.len_q, s.value_dim);
    p.dq = operand(dq, s.heads, s.len_q, s.head_dim);
    p.dk = operand(dk, s.kv_heads, s.len_kv, s.head_dim);
    p.dv = operand(dv, s.kv_heads, s.len_kv, s.value_dim);
    return p;
  }
};

// Options of one sweep case and the buffers its pointers refer to (kept alive with it).
struct CaseData {
  AttentionOptions options;
  std::vector<uint8_t> bool_mask;
  std::vector<float> float_mask;
  std::vector<float> slopes;
  std::vector<int64_t> lengths;
};

struct OptionCase {
  std::string name;
  AttentionShape shape;
  std::function<void(CaseData&)> setup;
};

// Max |a − b| over finite entries; infinities must match exactly, and NaN is a failure.
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN makes m NaN and fails the comparison below
  }
  return m;
}

// Every option and combination, on small odd shapes (option_cases.cc).
std::vector<OptionCase> option_cases();

}  // namespace headlight::attention::testing

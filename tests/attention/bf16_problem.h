// Helpers for the bf16 attention tests (flash_bf16_test.cc, flash_bf16_softmax_test.cc,
// kv_blocked_test.cc): a random problem whose q, k, v are bf16, its cache also in the blocked
// layout, a loop over the kernel paths, and the forward's bounds against the reference.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "attention_test_util.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/kv_layout.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"

namespace headlight::attention::testing {

// The bf16 forward against the reference on the same bf16 values (flash_bf16_test.cc's header
// derives them): every output within kBf16OutTol (values in [−1, 1]), the log-sum-exp and the
// statistics within kBf16RowTol.
constexpr double kBf16OutTol = 2.5e-3;
constexpr double kBf16RowTol = 1e-5;

// A random problem whose q, k, v are bf16 (the fp32 problem's values rounded), with an fp32 output
// and, beside it, a bf16 one; k and v also in blocked regions (kv_layout.h) on demand, whose
// entries past the last key are NaN: they must never reach an output.
struct Bf16Problem {
  Problem f;  // f.q/k/v hold the bf16 values widened; f.out is the fp32 output
  std::vector<bf16> q, k, v, out;
  std::vector<bf16> k_blocked, v_blocked;

  Bf16Problem(const AttentionShape& s, uint64_t seed) : f(s, seed) {
    auto round = [](std::vector<float>& x, std::vector<bf16>& y) {
      y.resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        y[i] = to_bf16(x[i]);
        x[i] = to_float(y[i]);
      }
    };
    round(f.q, q);
    round(f.k, k);
    round(f.v, v);
    out.assign(f.out.size(), bf16{});
  }

  static Operand operand(std::vector<bf16>& x, int64_t heads, int64_t rows, int64_t dim) {
    return Operand{.batch_stride = heads * rows * dim,
                   .head_stride = rows * dim,
                   .row_stride = dim,
                   .bf16 = x.data()};
  }

  // bf16 inputs; the output fp32 (f.out) or bf16 (out); k and v as rows, or blocked.
  AttentionParams params(const AttentionOptions& o, bool bf16_out, bool blocked = false) {
    const AttentionShape& s = f.shape;
    AttentionParams p = f.params(o);
    p.probs = nullptr;
    p.q = operand(q, s.heads, s.len_q, s.head_dim);
    p.k = operand(k, s.kv_heads, s.len_kv, s.head_dim);
    p.v = operand(v, s.kv_heads, s.len_kv, s.value_dim);
    if (bf16_out) p.out = operand(out, s.heads, s.len_q, s.value_dim);
    if (blocked) {
      const int64_t rk = blocked_region_elements(s.len_kv, s.head_dim);
      const int64_t rv = blocked_region_elements(s.len_kv, s.value_dim);
      fill_blocked(KvSide::keys, k, s.head_dim, rk, k_blocked);
      fill_blocked(KvSide::values, v, s.value_dim, rv, v_blocked);
      p.kv_layout = KvLayout::blocked;
      p.k = Operand{.batch_stride = s.kv_heads * rk, .head_stride = rk, .bf16 = k_blocked.data()};
      p.v = Operand{.batch_stride = s.kv_heads * rv, .head_stride = rv, .bf16 = v_blocked.data()};
    }
    return p;
  }

 private:
  void fill_blocked(KvSide side, const std::vector<bf16>& rows, int64_t dim, int64_t region,
                    std::vector<bf16>& dst) const {
    const int64_t heads = f.shape.batch * f.shape.kv_heads, keys = f.shape.len_kv;
    dst.assign(static_cast<size_t>(heads * region),
               to_bf16(std::numeric_limits<float>::quiet_NaN()));
    for (int64_t bg = 0; bg < heads; ++bg)
      write_blocked_rows(side, rows.data() + bg * keys * dim, dim, 0, keys, dim,
                         dst.data() + bg * region);
  }
};

// Runs fn on the native bf16 path (when this CPU has it) and on the portable path of each target.
template <typename Fn>
void for_each_path(Fn&& fn) {
  for (const char* isa : {"best", "avx3_bf16", "avx3", "avx2", "scalar"}) {
    force_isa(isa);
    SCOPED_TRACE(::testing::Message() << "isa " << isa << " -> " << cpu::flash_target());
    fn();
  }
  force_isa("best");
}

}  // namespace headlight::attention::testing

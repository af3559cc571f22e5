// The fused backward against the reference: every option of the sweep, odd lengths and head dims,
// several query chunks, and bitwise determinism across thread counts.

#include "headlight/attention/cpu/flash_backward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "attention_test_util.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/reference.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

namespace headlight::attention {
namespace {

using testing::CaseData;
using testing::option_cases;
using testing::OptionCase;
using testing::Problem;

// max |a − b| / max(max |b|, 1e-3).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-3;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= diff)) diff = d;
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

// Runs the fused forward then backward on `pr` (its out and lse are overwritten).
void fused_backward(ThreadContext& ctx, Problem& pr, const AttentionOptions& o) {
  AttentionParams p = pr.params(o);
  p.probs = nullptr;
  cpu::flash_forward(ctx, p);
  cpu::flash_backward(ctx, p);
}

void expect_matches_reference(const AttentionShape& shape, const AttentionOptions& o, double tol) {
  ThreadContext ctx(2);
  Problem ref(shape, 17), fused(shape, 17);
  reference::backward(ref.params(o));
  fused_backward(ctx, fused, o);
  EXPECT_LE(rel_diff(fused.dq, ref.dq), tol) << "dq";
  EXPECT_LE(rel_diff(fused.dk, ref.dk), tol) << "dk";
  EXPECT_LE(rel_diff(fused.dv, ref.dv), tol) << "dv";
}

TEST(FlashBackward, MatchesReferenceForEveryOption) {
  for (const char* isa : {"best", "avx2", "scalar"}) {
    force_isa(isa);
    for (const OptionCase& c : option_cases()) {
      SCOPED_TRACE(::testing::Message() << c.name << " isa " << isa);
      CaseData data;
      c.setup(data);
      expect_matches_reference(c.shape, data.options, 2e-5);
    }
  }
  force_isa("best");
}

TEST(FlashBackward, OddLengthsHeadDimsAndChunks) {
  struct Shape {
    AttentionShape shape;
    bool causal;
    Alignment align;
  };
  const Alignment tl = Alignment::top_left, br = Alignment::bottom_right;
  for (const Shape& s :
       {Shape{{1, 2, 2, 1, 1, 1, 1}, false, tl}, Shape{{2, 2, 1, 17, 97, 32, 32}, true, br},
        Shape{{1, 4, 2, 97, 255, 80, 64}, false, tl},
        Shape{{1, 2, 2, 255, 255, 128, 128}, true, tl},
        Shape{{1, 1, 1, 33, 300, 256, 256}, false, tl},
        Shape{{1, 1, 1, 2049, 130, 16, 16}, true, br},  // 3 query chunks
        Shape{{1, 3, 1, 1025, 1025, 64, 64}, true, tl},
        Shape{{1, 2, 1, 1100, 300, 64, 64}, false, tl}}) {  // long query blocks (144 rows)
    SCOPED_TRACE(::testing::Message() << "Lq " << s.shape.len_q << " Lk " << s.shape.len_kv << " D "
                                      << s.shape.head_dim);
    AttentionOptions o;
    o.causal = s.causal;
    o.alignment = s.align;
    expect_matches_reference(s.shape, o, 2e-5);
  }
}

TEST(FlashBackward, BitwiseDeterministicAcrossThreadCounts) {
  const AttentionShape shape{.batch = 2,
                             .heads = 4,
                             .kv_heads = 2,
                             .len_q = 1500,
                             .len_kv = 300,
                             .head_dim = 32,
                             .value_dim = 32};
  AttentionOptions o;
  o.causal = true;
  o.alignment = Alignment::bottom_right;
  Problem first(shape, 9);
  ThreadContext one(1);
  fused_backward(one, first, o);
  for (int threads : {2, 3}) {
    Problem again(shape, 9);
    ThreadContext ctx(threads);
    fused_backward(ctx, again, o);
    for (auto [a, b] : {std::pair{&first.dq, &again.dq}, std::pair{&first.dk, &again.dk},
                        std::pair{&first.dv, &again.dv}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << threads;
  }
}

TEST(FlashBackward, NeedsTheForwardsOutputAndLse) {
  ThreadContext ctx(1);
  Problem pr({.batch = 1,
              .heads = 1,
              .kv_heads = 1,
              .len_q = 3,
              .len_kv = 3,
              .head_dim = 2,
              .value_dim = 2});
  AttentionParams p = pr.params();
  p.lse = nullptr;
  EXPECT_THROW(cpu::flash_backward(ctx, p), Error);
}

}  // namespace
}  // namespace headlight::attention

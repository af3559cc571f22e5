// The fused forward against the reference: every option of the sweep, odd lengths and head dims,
// strided (packed QKV) inputs, the accuracy rule of docs/design.md §3 and bitwise determinism.

#include "headlight/attention/cpu/flash_forward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "attention_test_util.h"
#include "headlight/attention/reference.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

namespace headlight::attention {
namespace {

using testing::CaseData;
using testing::max_diff;
using testing::option_cases;
using testing::OptionCase;
using testing::Problem;

// The same random problem run through the reference and the fused forward: {reference, fused}.
std::pair<Problem, Problem> forward_both(ThreadContext& ctx, const AttentionShape& shape,
                                         uint64_t seed, const AttentionOptions& o) {
  Problem ref(shape, seed), fused(shape, seed);
  AttentionParams pr = ref.params(o);
  pr.probs = nullptr;
  reference::forward(pr);
  AttentionParams pf = fused.params(o);
  pf.probs = nullptr;
  cpu::flash_forward(ctx, pf);
  return {std::move(ref), std::move(fused)};
}

// A naive fp32 attention (float accumulation, two-pass softmax) for the accuracy rule.
std::vector<float> naive_fp32(const AttentionParams& p) {
  const AttentionShape& s = p.shape;
  std::vector<float> out(static_cast<size_t>(s.batch * s.heads * s.len_q * s.value_dim), 0.0f);
  const float scale = effective_scale(p);
  std::vector<float> sc(static_cast<size_t>(s.len_kv));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / (s.heads / s.kv_heads);
      for (int64_t i = 0; i < s.len_q; ++i) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < s.len_kv; ++j) {
          float dot = 0;
          for (int64_t e = 0; e < s.head_dim; ++e) dot += p.q.at(b, h, i)[e] * p.k.at(b, g, j)[e];
          sc[j] = scale * dot;
          mx = std::max(mx, sc[j]);
        }
        float sum = 0;
        for (int64_t j = 0; j < s.len_kv; ++j) sum += sc[j] = std::exp(sc[j] - mx);
        float* o = out.data() + ((b * s.heads + h) * s.len_q + i) * s.value_dim;
        for (int64_t j = 0; j < s.len_kv; ++j)
          for (int64_t e = 0; e < s.value_dim; ++e) o[e] += sc[j] / sum * p.v.at(b, g, j)[e];
      }
    }
  return out;
}

// Runs fn once for each instruction set this machine supports (the best first), forcing it.
template <typename Fn>
void for_each_isa(Fn&& fn) {
  for (const char* isa : {"best", "avx3", "avx2", "sse4", "scalar"}) {
    force_isa(isa);
    const std::string target = cpu::flash_target();
    SCOPED_TRACE(::testing::Message() << "isa " << isa << " -> " << target);
    fn();
  }
  force_isa("best");
}

TEST(FlashForward, ForcingTheIsaSelectsThatTarget) {
  force_isa("scalar");
  EXPECT_EQ(cpu::flash_target(), "SCALAR");
  force_isa("best");
  EXPECT_EQ(cpu::flash_target(), cpu_info().best_target);
  EXPECT_THROW(force_isa("mmx"), Error);
}

TEST(FlashForward, MatchesReferenceForEveryOption) {
  for_each_isa([] {
    ThreadContext ctx(2);
    for (const OptionCase& c : option_cases()) {
      SCOPED_TRACE(c.name);
      CaseData data;
      c.setup(data);
      auto [ref, fused] = forward_both(ctx, c.shape, 31, data.options);
      EXPECT_LE(max_diff(fused.out, ref.out), 2e-6);
      EXPECT_LE(max_diff(fused.lse, ref.lse), 2e-6);
    }
  });
}

struct SweepShape {
  int64_t batch, heads, kv_heads, len_q, len_kv, dim, vdim;
  bool causal;
  Alignment align;
};

TEST(FlashForward, OddLengthsHeadDimsAndTheAccuracyRule) {
  ThreadContext ctx(2);
  const Alignment tl = Alignment::top_left, br = Alignment::bottom_right;
  for (SweepShape s : {SweepShape{.batch = 1,
                      .heads = 2,
                      .kv_heads = 2,
                      .len_q = 1,
                      .len_kv = 1,
                      .dim = 1,
                      .vdim = 1,
                      .causal = false,
                      .align = tl},
                       SweepShape{.batch = 2,
                       .heads = 2,
                       .kv_heads = 1,
                       .len_q = 2,
                       .len_kv = 17,
                       .dim = 32,
                       .vdim = 32,
                       .causal = true,
                       .align = br},
                       SweepShape{.batch = 1,
                       .heads = 4,
                       .kv_heads = 2,
                       .len_q = 17,
                       .len_kv = 97,
                       .dim = 64,
                       .vdim = 64,
                       .causal = false,
                       .align = tl},
                       SweepShape{.batch = 1,
                       .heads = 2,
                       .kv_heads = 2,
                       .len_q = 97,
                       .len_kv = 97,
                       .dim = 80,
                       .vdim = 80,
                       .causal = true,
                       .align = tl},
                       SweepShape{.batch = 1,
                       .heads = 3,
                       .kv_heads = 1,
                       .len_q = 255,
                       .len_kv = 255,
                       .dim = 128,
                       .vdim = 128,
                       .causal = true,
                       .align = tl},
                       SweepShape{.batch = 1,
                       .heads = 1,
                       .kv_heads = 1,
                       .len_q = 49,
                       .len_kv = 1025,
                       .dim = 256,
                       .vdim = 256,
                       .causal = false,
                       .align = tl},
                       SweepShape{.batch = 1,
                       .heads = 2,
                       .kv_heads = 2,
                       .len_q = 1023,
                       .len_kv = 1023,
                       .dim = 64,
                       .vdim = 64,
                       .causal = true,
                       .align = tl},
                       SweepShape{.batch = 1,
                       .heads = 2,
                       .kv_heads = 1,
                       .len_q = 5,
                       .len_kv = 1025,
                       .dim = 64,
                       .vdim = 40,
                       .causal = true,
                       .align = br},
                       SweepShape{.batch = 1,
                       .heads = 2,
                       .kv_heads = 1,
                       .len_q = 1100,
                       .len_kv = 300,
                       .dim = 64,
                       .vdim = 64,
                       .causal = false,
                       .align = tl}}) {  // long query blocks (144 rows)
    SCOPED_TRACE(::testing::Message() << "Lq " << s.len_q << " Lk " << s.len_kv << " D " << s.dim);
    const AttentionShape shape{.batch = s.batch,
                               .heads = s.heads,
                               .kv_heads = s.kv_heads,
                               .len_q = s.len_q,
                               .len_kv = s.len_kv,
                               .head_dim = s.dim,
                               .value_dim = s.vdim};
    AttentionOptions o;
    o.causal = s.causal;
    o.alignment = s.align;
    auto [ref, fused] = forward_both(ctx, shape, 7, o);
    AttentionParams pr = ref.params(o);
    EXPECT_LE(max_diff(fused.out, ref.out), 1e-5);
    if (!s.causal) {  // the naive fp32 implementation has no masks
      const double naive = max_diff(naive_fp32(pr), ref.out);
      EXPECT_LE(max_diff(fused.out, ref.out), 2 * naive + 1e-7) << "naive fp32 error " << naive;
    }
  }
}

TEST(FlashForward, StridedPackedQkvInput) {
  // One buffer [B, L, 3, H, D] as a fused QKV projection writes it; no copies.
  ThreadContext ctx(2);
  const int64_t B = 2, L = 37, H = 3, D = 16;
  std::vector<float> qkv(static_cast<size_t>(B * L * 3 * H * D));
  Generator g(5);
  for (auto& x : qkv) x = g.uniform(-1, 1);
  auto view = [&](int which) {
    return Operand{.data = qkv.data() + which * H * D,
                   .batch_stride = L * 3 * H * D,
                   .head_stride = D,
                   .row_stride = 3 * H * D};
  };
  std::vector<float> out_ref(static_cast<size_t>(B * H * L * D)), out_fused(out_ref.size());
  AttentionParams p;
  p.shape = {.batch = B,
             .heads = H,
             .kv_heads = H,
             .len_q = L,
             .len_kv = L,
             .head_dim = D,
             .value_dim = D};
  p.options.causal = true;
  p.q = view(0);
  p.k = view(1);
  p.v = view(2);
  p.out = Operand{
      .data = out_ref.data(), .batch_stride = H * L * D, .head_stride = L * D, .row_stride = D};
  reference::forward(p);
  p.out = Operand{
      .data = out_fused.data(), .batch_stride = H * L * D, .head_stride = L * D, .row_stride = D};
  cpu::flash_forward(ctx, p);
  EXPECT_LE(max_diff(out_fused, out_ref), 2e-6);
}

TEST(FlashForward, BitwiseDeterministicAcrossThreadCounts) {
  const AttentionShape shape{.batch = 2,
                             .heads = 4,
                             .kv_heads = 2,
                             .len_q = 200,
                             .len_kv = 300,
                             .head_dim = 64,
                             .value_dim = 64};
  AttentionOptions o;
  o.causal = true;
  o.alignment = Alignment::bottom_right;
  Problem p1(shape, 3);
  ThreadContext one(1);
  AttentionParams a = p1.params(o);
  a.probs = nullptr;
  cpu::flash_forward(one, a);
  const std::vector<float> first = p1.out;
  for (int threads : {2, 3}) {
    ThreadContext ctx(threads);
    for (int run = 0; run < 2; ++run) {
      std::fill(p1.out.begin(), p1.out.end(), 0.0f);
      cpu::flash_forward(ctx, a);
      EXPECT_EQ(std::memcmp(first.data(), p1.out.data(), first.size() * sizeof(float)), 0)
          << threads << " threads, run " << run;
    }
  }
}

TEST(FlashForward, NanStaysInTheAffectedRow) {
  ThreadContext ctx(1);
  Problem pr({.batch = 1,
              .heads = 2,
              .kv_heads = 2,
              .len_q = 3,
              .len_kv = 200,
              .head_dim = 4,
              .value_dim = 4});
  pr.q[1 * 4 + 2] = std::nanf("");  // batch 0, head 0, row 1
  AttentionParams p = pr.params();
  p.probs = nullptr;
  cpu::flash_forward(ctx, p);
  for (int e = 0; e < 4; ++e) {
    EXPECT_TRUE(std::isnan(pr.out[1 * 4 + e]));
    EXPECT_FALSE(std::isnan(pr.out[0 * 4 + e]));
    EXPECT_FALSE(std::isnan(pr.out[2 * 4 + e]));
    EXPECT_FALSE(std::isnan(pr.out[3 * 4 + e]));  // head 1
  }
}

TEST(FlashDecode, FewQueryRowsAgainstLongKeysMatchTheReference) {
  // Lq ≤ 16 with more than 512 keys (2 blocks) takes the split-key decode path: keys and values
  // read in place when Dv is a whole number of vectors, packed otherwise; with fewer keys, the
  // decode path when it reads them in place (one split), else the ordinary tiles. Every
  // instruction set: the in-place scores fold a register tile whose size depends on the vector
  // length.
  ThreadContext ctx(3);
  struct DecodeCase {
    AttentionShape shape;
    bool causal;
    int64_t window_left;
    std::vector<int64_t> lengths;
    float softcap;
  };
  for_each_isa([&] {
    for (const DecodeCase& c :
         {DecodeCase{.shape = {.batch = 1,
                              .heads = 8,
                              .kv_heads = 2,
                              .len_q = 1,
                              .len_kv = 4097,
                              .head_dim = 64,
                              .value_dim = 64},
         .causal = true,
         .window_left = -1,
         .lengths = {},
         .softcap = 0.0f},
          DecodeCase{.shape = {.batch = 2,
                              .heads = 4,
                              .kv_heads = 4,
                              .len_q = 3,
                              .len_kv = 1000,
                              .head_dim = 32,
                              .value_dim = 16},
          .causal = true,
          .window_left = -1,
          .lengths = {1000, 700},
          .softcap = 0.0f},
          DecodeCase{.shape = {.batch = 1,
                              .heads = 4,
                              .kv_heads = 1,
                              .len_q = 16,
                              .len_kv = 2049,
                              .head_dim = 128,
                              .value_dim = 128},
          .causal = false,
          .window_left = 300,
          .lengths = {},
          .softcap = 0.0f},
          // Value rows of 128 (prefetched by the register-tile scores on AVX-512) for an odd number
          // of rows (3 query heads of one group: a pass of two rows, then one).
          DecodeCase{.shape = {.batch = 1,
                              .heads = 3,
                              .kv_heads = 1,
                              .len_q = 1,
                              .len_kv = 1300,
                              .head_dim = 128,
                              .value_dim = 128},
          .causal = false,
          .window_left = -1,
          .lengths = {},
          .softcap = 0.0f},
          DecodeCase{.shape = {.batch = 2,
                              .heads = 2,
                              .kv_heads = 2,
                              .len_q = 5,
                              .len_kv = 777,
                              .head_dim = 80,
                              .value_dim = 80},
          .causal = true,
          .window_left = -1,
          .lengths = {0, 777},
          .softcap = 30.0f},
          DecodeCase{.shape = {.batch = 1,
                              .heads = 6,
                              .kv_heads = 2,
                              .len_q = 2,
                              .len_kv = 1500,
                              .head_dim = 24,
                              .value_dim = 40},
          .causal = true,
          .window_left = -1,
          .lengths = {},
          .softcap = 0.0f},  // packed (Dv 40)
          // In place with a head dim that is not a whole number of vectors (the masked last
          // vector) and 6 rows (a tile of 4, then single rows).
          DecodeCase{.shape = {.batch = 1,
                              .heads = 6,
                              .kv_heads = 2,
                              .len_q = 2,
                              .len_kv = 1100,
                              .head_dim = 20,
                              .value_dim = 16},
          .causal = false,
          .window_left = -1,
          .lengths = {},
          .softcap = 0.0f},
          // Short caches: in place (one split), and packed (Dv 40: the ordinary tiles).
          DecodeCase{.shape = {.batch = 2,
                              .heads = 8,
                              .kv_heads = 2,
                              .len_q = 3,
                              .len_kv = 300,
                              .head_dim = 64,
                              .value_dim = 64},
          .causal = true,
          .window_left = 100,
          .lengths = {300, 211},
          .softcap = 0.0f},
          DecodeCase{.shape = {.batch = 1,
                              .heads = 4,
                              .kv_heads = 2,
                              .len_q = 1,
                              .len_kv = 77,
                              .head_dim = 24,
                              .value_dim = 40},
          .causal = true,
          .window_left = -1,
          .lengths = {},
          .softcap = 0.0f},
          // Enough (batch, key/value head) pairs and key blocks for longer pieces
          // (decode_split_blocks: 2 · 4 · 11 blocks → 5 blocks a piece), the last one shorter.
          DecodeCase{.shape = {.batch = 2,
                              .heads = 8,
                              .kv_heads = 4,
                              .len_q = 2,
                              .len_kv = 2600,
                              .head_dim = 64,
                              .value_dim = 64},
          .causal = true,
          .window_left = -1,
          .lengths = {2600, 1900},
          .softcap = 0.0f},
          // 64 query heads over one key/value head, 16 rows each: 1,024 rows share the key rows,
          // more than one softmax call takes (it splits them; 256 at a time).
          DecodeCase{.shape = {.batch = 1,
                              .heads = 64,
                              .kv_heads = 1,
                              .len_q = 16,
                              .len_kv = 600,
                              .head_dim = 32,
                              .value_dim = 32},
          .causal = true,
          .window_left = -1,
          .lengths = {},
          .softcap = 0.0f}}) {
      SCOPED_TRACE(::testing::Message() << "Lq " << c.shape.len_q << " Lk " << c.shape.len_kv);
      AttentionOptions o;
      o.causal = c.causal;
      o.alignment = Alignment::bottom_right;  // the KV-cache convention
      o.window_left = c.window_left;
      o.key_lengths = c.lengths.empty() ? nullptr : c.lengths.data();
      o.softcap = c.softcap;
      auto [ref, fused] = forward_both(ctx, c.shape, 13, o);
      AttentionParams pf = fused.params(o);
      pf.probs = nullptr;
      EXPECT_LE(max_diff(fused.out, ref.out), 2e-6);
      EXPECT_LE(max_diff(fused.lse, ref.lse), 2e-6);
      // The splits do not depend on the thread count: bitwise the same on one thread.
      const std::vector<float> three = fused.out;
      ThreadContext one(1);
      cpu::flash_forward(one, pf);
      EXPECT_EQ(std::memcmp(three.data(), fused.out.data(), three.size() * sizeof(float)), 0);
    }
  });
}

// Entropy, argmax and max weight of every row from the kernel behind `run`, on a copy of `pr`.
struct RowStats {
  std::vector<float> entropy, max_weight;
  std::vector<int64_t> argmax;
};

template <typename Run>
RowStats row_stats(Problem pr, const AttentionOptions& o, Run&& run) {
  const AttentionShape& s = pr.shape;
  const size_t n = static_cast<size_t>(s.batch * s.heads * s.len_q);
  RowStats st{std::vector<float>(n, -7.0f), std::vector<float>(n, -7.0f),
              std::vector<int64_t>(n, -7)};
  AttentionParams p = pr.params(o);
  p.probs = nullptr;
  p.entropy = st.entropy.data();
  p.max_weight = st.max_weight.data();
  p.argmax = st.argmax.data();
  run(p);
  return st;
}

void expect_same_stats(const RowStats& a, const RowStats& b) {
  EXPECT_LE(max_diff(a.entropy, b.entropy), 1e-5);
  EXPECT_LE(max_diff(a.max_weight, b.max_weight), 2e-6);
  EXPECT_EQ(a.argmax, b.argmax);
}

TEST(FlashForward, RowStatisticsMatchTheReference) {
  ThreadContext ctx(2);
  auto fused = [&](const AttentionParams& p) { cpu::flash_forward(ctx, p); };
  auto ref = [](const AttentionParams& p) { reference::forward(p); };
  for (const OptionCase& c : option_cases()) {
    SCOPED_TRACE(c.name);
    CaseData data;
    c.setup(data);
    Problem pr(c.shape, 19);
    expect_same_stats(row_stats(pr, data.options, fused), row_stats(pr, data.options, ref));
  }
  // Longer rows (several key blocks) and the split-key decode path.
  for (AttentionShape shape : {AttentionShape{.batch = 1,
                              .heads = 2,
                              .kv_heads = 1,
                              .len_q = 100,
                              .len_kv = 700,
                              .head_dim = 32,
                              .value_dim = 32},
                               AttentionShape{.batch = 2,
                               .heads = 4,
                               .kv_heads = 2,
                               .len_q = 3,
                               .len_kv = 3000,
                               .head_dim = 64,
                               .value_dim = 64},
                               AttentionShape{.batch = 2,
                               .heads = 8,
                               .kv_heads = 4,
                               .len_q = 1,
                               .len_kv = 2600,
                               .head_dim = 64,
                               .value_dim = 64}}) {
    AttentionOptions o;
    o.causal = true;
    o.alignment = Alignment::bottom_right;
    Problem pr(shape, 23);
    expect_same_stats(row_stats(pr, o, fused), row_stats(pr, o, ref));
  }
}

TEST(Probabilities, MatchTheReferenceForEveryOption) {
  ThreadContext ctx(2);
  for (const OptionCase& c : option_cases()) {
    SCOPED_TRACE(c.name);
    CaseData data;
    c.setup(data);
    Problem ref(c.shape, 41), fused(c.shape, 41);
    reference::forward(ref.params(data.options));
    AttentionParams pf = fused.params(data.options);
    pf.probs = nullptr;
    cpu::flash_forward(ctx, pf);
    std::vector<float> probs(ref.probs.size(), -1.0f);
    cpu::probabilities(ctx, pf, {}, probs.data());
    EXPECT_LE(max_diff(probs, ref.probs), 2e-6);
  }
}

TEST(Probabilities, SubsetOfHeadsAndRows) {
  ThreadContext ctx(2);
  const AttentionShape shape{.batch = 2,
                             .heads = 4,
                             .kv_heads = 2,
                             .len_q = 300,
                             .len_kv = 333,
                             .head_dim = 32,
                             .value_dim = 32};
  AttentionOptions o;
  o.causal = true;
  Problem ref(shape, 5), fused(shape, 5);
  reference::forward(ref.params(o));
  AttentionParams pf = fused.params(o);
  pf.probs = nullptr;
  cpu::flash_forward(ctx, pf);
  cpu::ProbabilitiesRequest req;
  req.heads = {3, 0};
  req.row_begin = 100;
  req.row_end = 250;
  std::vector<float> probs(2 * 2 * 150 * 333);
  cpu::probabilities(ctx, pf, req, probs.data());
  double worst = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < 150; ++i)
        for (int64_t j = 0; j < 333; ++j) {
          const float want = ref.probs[(((b * 4 + req.heads[k]) * 300) + 100 + i) * 333 + j];
          const float got = probs[((b * 2 + k) * 150 + i) * 333 + j];
          worst = std::max(worst, std::fabs(double(want) - got));
        }
  EXPECT_LE(worst, 2e-6);
  req.heads = {4};
  EXPECT_THROW(cpu::probabilities(ctx, pf, req, probs.data()), Error);
  req.heads = {0};
  req.row_end = 301;
  EXPECT_THROW(cpu::probabilities(ctx, pf, req, probs.data()), Error);
}

TEST(FlashForward, RefusesToMaterialiseProbabilities) {
  ThreadContext ctx(1);
  Problem pr({.batch = 1,
              .heads = 1,
              .kv_heads = 1,
              .len_q = 2,
              .len_kv = 2,
              .head_dim = 2,
              .value_dim = 2});
  EXPECT_THROW(cpu::flash_forward(ctx, pr.params()), Error);
}

}  // namespace
}  // namespace headlight::attention

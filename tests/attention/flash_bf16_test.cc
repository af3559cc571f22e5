// The fused forward with bf16 inputs against the reference on the same bf16 values (exact
// attention in double): every option, odd head dims and lengths, decode, statistics,
// probabilities, bf16 outputs, on every path this CPU has: AMX, AVX-512 BF16's vdpbf16ps
// (HEADLIGHT_ISA=avx3_bf16) and the portable one (HEADLIGHT_ISA=avx3 and below).
//
// The bound. The kernel's only roundings beyond fp32 arithmetic are the probabilities, rounded to
// bf16 (relative error ≤ 2⁻⁹) before P·V while the normaliser l sums them unrounded: the output
// differs from exact attention by at most Σ_j |P̂_j − P_j|·|v_j| ≤ 2⁻⁹·max|v| plus fp32 rounding,
// so with values in [−1, 1] every output is within 2.5·10⁻³ of the reference (a bf16 output adds
// half an ulp of bf16, 2⁻⁹ relative). Scores, the log-sum-exp and the statistics are fp32 sums of
// exact products: within 10⁻⁵.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "bf16_problem.h"
#include "headlight/attention/cpu/flash_backward.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/dispatch.h"
#include "headlight/attention/reference.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

namespace headlight::attention {
namespace {

using testing::Bf16Problem;
using testing::CaseData;
using testing::for_each_path;
using testing::max_diff;
using testing::option_cases;
using testing::OptionCase;
using testing::Problem;

constexpr double kOutTol = testing::kBf16OutTol;
constexpr double kRowTol = testing::kBf16RowTol;

std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  to_float(x.data(), y.data(), x.size());
  return y;
}

// Max |a − b| relative to the largest |b| (or 1 when that is smaller).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1.0;
  for (float x : b) scale = std::max(scale, double(std::fabs(x)));
  return max_diff(a, b) / scale;
}

TEST(FlashBf16, LongKeysTakeLargerRowBlocks) {
  // From kLongKeys (16,384) keys up the bf16 items hold more query rows (256 on AMX, 240 on
  // vdpbf16ps and the widened path): 250 rows make one whole item and one of 10 rows, 16,400 keys
  // a last key block of 16; two query heads share a key/value head. Without a mask and causal
  // aligned bottom-right (row i sees keys up to i + 16,150). On AMX also from 1 MiB of one
  // key/value head's K and V up (kLongKvBytes): 4,100 keys at D = 128, 300 rows (an item of 256
  // and one of 44), a last key block of 4.
  for (const AttentionShape& shape :
       {AttentionShape{1, 2, 1, 250, 16400, 24, 24}, AttentionShape{1, 1, 1, 300, 4100, 128, 128}})
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << (causal ? "causal" : "no mask") << ", " << shape.len_kv << " keys");
      const AttentionOptions options{.causal = causal, .alignment = Alignment::bottom_right};
      Bf16Problem ref(shape, 53);
      AttentionParams pr = ref.params(options, false);
      reference::forward(pr);
      for (const char* isa : {"best", "avx3_bf16", "avx3"}) {
        force_isa(isa);
        SCOPED_TRACE(::testing::Message() << "isa " << isa << " -> " << cpu::flash_target());
        ThreadContext ctx(2);
        Bf16Problem fused(shape, 53);
        cpu::flash_forward(ctx, fused.params(options, false));
        EXPECT_LE(max_diff(fused.f.out, ref.f.out), kOutTol);
        EXPECT_LE(max_diff(fused.f.lse, ref.f.lse), kRowTol);
      }
      force_isa("best");
    }
}

TEST(FlashBf16, MatchesTheReferenceOnTheBf16ValuesForEveryOption) {
  for_each_path([] {
    ThreadContext ctx(2);
    for (const OptionCase& c : option_cases()) {
      SCOPED_TRACE(c.name);
      CaseData data;
      c.setup(data);
      Bf16Problem ref(c.shape, 31), fused(c.shape, 31);
      AttentionParams pr = ref.params(data.options, false);
      reference::forward(pr);
      cpu::flash_forward(ctx, fused.params(data.options, false));
      EXPECT_LE(max_diff(fused.f.out, ref.f.out), kOutTol);
      EXPECT_LE(max_diff(fused.f.lse, ref.f.lse), kRowTol);
      // A bf16 output: the fp32 result rounded once.
      Bf16Problem half(c.shape, 31);
      cpu::flash_forward(ctx, half.params(data.options, true));
      const std::vector<float> h = widen(half.out);
      for (size_t i = 0; i < h.size(); ++i) {
        ASSERT_LE(std::fabs(h[i] - ref.f.out[i]), kOutTol + std::fabs(ref.f.out[i]) / 256) << i;
        ASSERT_EQ(half.out[i].bits, to_bf16(fused.f.out[i]).bits) << i;
      }
    }
  });
}

struct Shape7 {
  int64_t batch, heads, kv_heads, len_q, len_kv, dim, vdim;
  bool causal;
};

TEST(FlashBf16, OddShapesDecodeAndLongRows) {
  for_each_path([&] {
    // A context of its own on each path: scratch another path packed can hide a pair word this
    // one leaves unwritten (an odd last key on a one-lane target had been).
    ThreadContext ctx(2);
    for (Shape7 s :
         {Shape7{1, 1, 1, 1, 1, 1, 1, false}, Shape7{2, 4, 2, 37, 19, 3, 5, true},
          Shape7{1, 2, 1, 70, 300, 33, 17, false}, Shape7{1, 4, 1, 3, 1300, 64, 64, true},
          Shape7{1, 2, 2, 1, 2100, 128, 128, false}, Shape7{1, 1, 1, 1100, 600, 64, 64, false},
          Shape7{2, 2, 2, 200, 200, 128, 80, true}, Shape7{1, 4, 1, 131, 131, 32, 32, true},
          Shape7{1, 1, 1, 255, 255, 64, 64, false}, Shape7{1, 1, 1, 19, 19, 32, 32, true}}) {
      SCOPED_TRACE(::testing::Message() << "L " << s.len_q << " S " << s.len_kv << " D " << s.dim
                                        << " Dv " << s.vdim << " G " << s.heads / s.kv_heads);
      const AttentionShape shape{s.batch, s.heads, s.kv_heads, s.len_q, s.len_kv, s.dim, s.vdim};
      AttentionOptions o;
      o.causal = s.causal;
      o.alignment = Alignment::bottom_right;
      Bf16Problem ref(shape, 5), fused(shape, 5);
      AttentionParams pr = ref.params(o, false);
      reference::forward(pr);
      AttentionParams pf = fused.params(o, false);
      std::vector<float> ent(ref.f.lse.size()), ent_ref(ref.f.lse.size());
      std::vector<float> mw(ref.f.lse.size()), mw_ref(ref.f.lse.size());
      std::vector<int64_t> am(ref.f.lse.size()), am_ref(ref.f.lse.size());
      pr.entropy = ent_ref.data(), pr.max_weight = mw_ref.data(), pr.argmax = am_ref.data();
      pf.entropy = ent.data(), pf.max_weight = mw.data(), pf.argmax = am.data();
      reference::forward(pr);
      cpu::flash_forward(ctx, pf);
      EXPECT_LE(max_diff(fused.f.out, ref.f.out), kOutTol);
      EXPECT_LE(max_diff(fused.f.lse, ref.f.lse), kRowTol);
      EXPECT_LE(max_diff(ent, ent_ref), 1e-4);
      EXPECT_LE(max_diff(mw, mw_ref), kRowTol);
      int ties = 0;  // argmax may differ only where two keys' weights are within rounding
      for (size_t i = 0; i < am.size(); ++i) ties += am[i] != am_ref[i];
      EXPECT_LE(ties, 1);
      // A bf16 output, within its rounding (an odd number of keys on a one-lane target had left
      // the last key's pair words unwritten: garbage, often NaN, in every row).
      Bf16Problem half(shape, 5);
      cpu::flash_forward(ctx, half.params(o, true));
      const std::vector<float> h = widen(half.out);
      for (size_t i = 0; i < h.size(); ++i)
        ASSERT_LE(std::fabs(h[i] - ref.f.out[i]), kOutTol + std::fabs(ref.f.out[i]) / 256) << i;
    }
  });
}

TEST(FlashBf16, DecodeFromABf16CacheForEveryOption) {
  // Decode (≤ 16 query rows) reads a bf16 cache in place, for one query row or few rows per
  // key/value head (decode_in_place), also from a short cache (≤ 512 keys, one split): on
  // vdpbf16ps for two or more rows per key/value head when D and Dv are multiples of 32 up to
  // 128 (up to 128 rows, 32 for a short cache: 64 rows over 1,100 keys and 32 over 400 here), else
  // each element widened as it is loaded (D = 64 with Dv = 48); otherwise keys and values are
  // packed (more rows, or Dv not a whole number of vectors), and a short cache then takes the
  // ordinary tiles. Shapes: GQA 32/8 at D = 128 with a last key alone in its group of four; an odd
  // number of rows per key/value head (a row pair, then one row) at D = 64 and at D = 128 (P·V over
  // whole value rows); one row per key/value head at D = 128 (scores 16 keys at a time, no
  // prefetch) with a tail of 7 keys; D = 32 with Dv = 96; 64 query heads over one key/value head
  // with 16 rows (1,024 rows share the packed keys: more than one softmax call takes); D = 256; Dv
  // = 80 (packed on AVX-512); short caches: one row over 32/8 heads and 300 keys, 8 rows per
  // key/value head and 100 keys (in place), 64 rows and 257 keys (the ordinary tiles); longer
  // pieces and tiles (decode_split_blocks, plan.tile_keys) over 2,600 keys: 16 heads over 8, one
  // row (pieces of 5 key blocks read as tiles of 1,024 and 256 keys, a last piece of 40 keys), and
  // 2 × 16 heads over 4 with 4 rows (16 rows a group: the same tiles); on AMX, rows read as tiles
  // (amx::rows_scores, rows_pv) in two blocks of 16 query rows, the second short (24 rows a
  // group) or whole (32 rows, D = 96 with Dv = 128), and one group of 32 outputs (D = 128 with
  // Dv = 32). Options: each alone, then
  // all together. Where D and Dv are multiples of 32 the cache is also given blocked
  // (kv_layout.h, its entries past the last key NaN): read in place by the blocked loops for
  // decode on vdpbf16ps (1 to 8 rows a key/value head, Dv = 96 in slabs of 32), through a row copy
  // on every other path and shape.
  const float inf = std::numeric_limits<float>::infinity();
  struct Opt {
    const char* name;
    bool causal = false;
    int64_t window_left = -1, window_right = -1;
    bool lengths = false, alibi = false, additive = false, stats = false;
    float softcap = 0.0f, dropout = 0.0f;
  };
  const Opt opts[] = {{.name = "plain"},
                      {.name = "causal", .causal = true},
                      {.name = "window", .window_left = 300, .window_right = 0},
                      {.name = "key lengths", .lengths = true},
                      {.name = "alibi", .alibi = true},
                      {.name = "additive mask", .additive = true},
                      {.name = "statistics", .stats = true},
                      {.name = "softcap", .softcap = 2.0f},
                      {.name = "dropout", .dropout = 0.25f},
                      {.name = "everything",
                       .causal = true,
                       .window_left = 700,
                       .lengths = true,
                       .alibi = true,
                       .additive = true,
                       .stats = true,
                       .softcap = 4.0f,
                       .dropout = 0.1f}};
  const AttentionShape shapes[] = {
      {1, 32, 8, 1, 1025, 128, 128}, {1, 3, 1, 3, 1029, 64, 64},   {2, 4, 4, 3, 1000, 32, 96},
      {1, 64, 1, 16, 600, 64, 64},   {1, 2, 1, 5, 700, 256, 32},   {1, 4, 2, 2, 800, 64, 80},
      {1, 32, 8, 1, 300, 128, 128},  {2, 8, 2, 2, 100, 64, 64},    {1, 16, 1, 4, 257, 64, 64},
      {1, 6, 2, 1, 1029, 128, 128},  {1, 2, 2, 1, 1031, 128, 128}, {1, 8, 2, 2, 900, 64, 48},
      {1, 8, 1, 8, 1100, 64, 64},    {1, 8, 1, 4, 400, 64, 64},    {1, 16, 8, 1, 2600, 128, 128},
      {2, 16, 4, 4, 2600, 64, 64},   {1, 24, 1, 1, 1500, 64, 64},  {1, 32, 2, 2, 1100, 96, 128},
      {1, 8, 2, 2, 1500, 128, 32}};
  ThreadContext ctx(2);
  for (const AttentionShape& shape : shapes)
    for (const Opt& opt : opts) {
      SCOPED_TRACE(::testing::Message()
                   << opt.name << ": H " << shape.heads << " Hkv " << shape.kv_heads << " L "
                   << shape.len_q << " S " << shape.len_kv << " D " << shape.head_dim << " Dv "
                   << shape.value_dim);
      AttentionOptions o{
          .causal = opt.causal,
          .alignment = Alignment::bottom_right,
          .window_left = opt.window_left < 0 ? -1 : std::min(opt.window_left, shape.len_kv / 3),
          .window_right = opt.window_right,
          .softcap = opt.softcap,
          .dropout_p = opt.dropout,
          .dropout_seed = 17};
      std::vector<int64_t> lengths;
      for (int64_t b = 0; b < shape.batch; ++b) lengths.push_back(shape.len_kv - 37 * (b + 1));
      if (opt.lengths) o.key_lengths = lengths.data();
      std::vector<float> slopes;
      for (int64_t h = 0; h < shape.heads; ++h) slopes.push_back(0.01f * float(h % 5 + 1));
      if (opt.alibi) o.alibi_slopes = slopes.data();
      std::vector<float> bias(static_cast<size_t>(shape.len_q * shape.len_kv));
      for (size_t i = 0; i < bias.size(); ++i)
        bias[i] = i % 11 == 3 ? -inf : 0.25f * static_cast<float>(i % 7) - 0.75f;
      if (opt.additive)
        o.mask = {.kind = MaskKind::additive, .data = bias.data(), .row_stride = shape.len_kv};
      Bf16Problem ref(shape, 61), fused(shape, 61);
      AttentionParams pr = ref.params(o, false);
      const size_t n = ref.f.lse.size();
      std::vector<float> ent(n), ent_ref(n), mw(n), mw_ref(n);
      std::vector<int64_t> am(n), am_ref(n);
      if (opt.stats)
        pr.entropy = ent_ref.data(), pr.max_weight = mw_ref.data(), pr.argmax = am_ref.data();
      reference::forward(pr);
      const bool blockable = shape.head_dim % 32 == 0 && shape.value_dim % 32 == 0;
      for (const bool blocked : {false, true}) {
        if (blocked && !blockable) continue;
        SCOPED_TRACE(blocked ? "blocked cache" : "rows");
        AttentionParams pf = fused.params(o, false, blocked);
        if (opt.stats) pf.entropy = ent.data(), pf.max_weight = mw.data(), pf.argmax = am.data();
        for_each_path([&] {
          cpu::flash_forward(ctx, pf);
          EXPECT_LE(max_diff(fused.f.out, ref.f.out), kOutTol);
          EXPECT_LE(max_diff(fused.f.lse, ref.f.lse), kRowTol);
          if (opt.stats) {
            EXPECT_LE(max_diff(ent, ent_ref), 1e-4);
            EXPECT_LE(max_diff(mw, mw_ref), kRowTol);
            int ties = 0;  // argmax may differ only where two keys' weights are within rounding
            for (size_t i = 0; i < n; ++i) ties += am[i] != am_ref[i];
            EXPECT_LE(ties, 1);
          }
        });
      }
    }
}

TEST(FlashBf16, ItemsPackingTheirOwnKeysMatchTheSharedPacking) {
  // With few key blocks and enough (batch, key/value head) pairs per thread an item is a whole
  // pair that packs its own keys (kLocalPackBlocks, kLocalPackItemsPerThread); otherwise every
  // item reads one shared packing. 8 pairs and 300 keys (2 blocks): one and two threads take the
  // first way, three threads the second. Both dtypes, every path, with options that touch every
  // stage of a tile (ALiBi, a boolean mask, soft-cap, dropout, the row statistics): the same bits,
  // and the reference's values; the backward (one query chunk) packs its keys the same two ways.
  const AttentionShape shape{4, 4, 2, 100, 300, 40, 40};
  std::vector<float> slopes = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<uint8_t> allowed(static_cast<size_t>(shape.len_q * shape.len_kv));
  for (size_t i = 0; i < allowed.size(); ++i) allowed[i] = i % 7 != 3;
  const AttentionOptions o{
      .causal = true,
      .alignment = Alignment::bottom_right,
      .alibi_slopes = slopes.data(),
      .softcap = 5.0f,
      .dropout_p = 0.1f,
      .dropout_seed = 3,
      .mask = {.kind = MaskKind::boolean, .data = allowed.data(), .row_stride = shape.len_kv}};
  for_each_path([&] {
    for (const bool bf16_inputs : {false, true}) {
      SCOPED_TRACE(bf16_inputs ? "bf16" : "fp32");
      std::vector<float> first;
      for (const int threads : {1, 2, 3}) {
        ThreadContext ctx(threads);
        Bf16Problem pb(shape, 77);
        AttentionParams p = bf16_inputs ? pb.params(o, false) : pb.f.params(o);
        p.probs = nullptr;
        std::vector<float> ent(pb.f.lse.size());
        p.entropy = ent.data();
        cpu::flash_forward(ctx, p);
        p.entropy = nullptr;
        backward(ctx, p, KernelChoice::fused);  // the bf16 backward packs the same two ways
        std::vector<float> all = pb.f.out;
        for (const std::vector<float>* x : {&pb.f.lse, &ent, &pb.f.dq, &pb.f.dk, &pb.f.dv})
          all.insert(all.end(), x->begin(), x->end());
        if (first.empty()) {
          first = all;
          Bf16Problem ref(shape, 77);
          AttentionParams pr = ref.params(o, false);
          reference::forward(pr);
          reference::backward(pr);
          EXPECT_LE(max_diff(pb.f.out, ref.f.out), bf16_inputs ? kOutTol : 2e-5);
          EXPECT_LE(max_diff(pb.f.lse, ref.f.lse), 2e-5);
          EXPECT_LE(rel_diff(pb.f.dk, ref.f.dk), bf16_inputs ? 1.0 / 64 : 1e-4);
          EXPECT_LE(rel_diff(pb.f.dv, ref.f.dv), bf16_inputs ? 1.0 / 64 : 1e-4);
        }
        EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size() * sizeof(float)), 0)
            << threads << " threads";
      }
    }
  });
}

TEST(FlashBf16, DecodeItemsOfWholePairsMatchSplitItems) {
  // Decode cuts the keys into splits. With at least kDecodePairsPerThread (batch, key/value head)
  // pairs per thread an item runs a whole pair's splits and merges them itself; otherwise each
  // split is an item and a second pass merges them (run_decode). 2 × 4 pairs: one and two threads
  // take the first way, three threads the second. 3 query rows over 2,100 keys (splits of 4, 4
  // and 1 key blocks), a shorter cache in the second batch, causal bottom-right and the row
  // statistics; fp32, bf16 and the blocked cache, and value rows of 36 (not whole vectors: the
  // keys and values packed first); every path: the same bits, and the reference's values.
  const std::vector<int64_t> lengths = {2100, 1500};
  const AttentionOptions o{
      .causal = true, .alignment = Alignment::bottom_right, .key_lengths = lengths.data()};
  for_each_path([&] {
    for (const int64_t dv : {64, 36})
      for (const int input : {0, 1, 2}) {  // fp32, bf16 rows, bf16 blocked
        if (input == 2 && dv % 32 != 0) continue;
        SCOPED_TRACE(std::string(input == 0   ? "fp32"
                                 : input == 1 ? "bf16"
                                              : "bf16 blocked") +
                     ", Dv " + std::to_string(dv));
        const AttentionShape shape{2, 8, 4, 3, 2100, 64, dv};
        std::vector<float> first;
        for (const int threads : {1, 2, 3}) {
          ThreadContext ctx(threads);
          Bf16Problem pb(shape, 21);
          AttentionParams p = input == 0 ? pb.f.params(o) : pb.params(o, false, input == 2);
          p.probs = nullptr;
          std::vector<float> ent(pb.f.lse.size());
          std::vector<int64_t> best(pb.f.lse.size());
          p.entropy = ent.data();
          p.argmax = best.data();
          cpu::flash_forward(ctx, p);
          std::vector<float> all = pb.f.out;
          all.insert(all.end(), pb.f.lse.begin(), pb.f.lse.end());
          all.insert(all.end(), ent.begin(), ent.end());
          for (const int64_t b : best) all.push_back(static_cast<float>(b));
          if (first.empty()) {
            first = all;
            Bf16Problem ref(shape, 21);
            AttentionParams pr = input == 0 ? ref.f.params(o) : ref.params(o, false);
            pr.probs = nullptr;
            std::vector<float> ref_ent(ent.size());
            std::vector<int64_t> ref_best(best.size());
            pr.entropy = ref_ent.data();
            pr.argmax = ref_best.data();
            reference::forward(pr);
            EXPECT_LE(max_diff(pb.f.out, ref.f.out), input == 0 ? 2e-5 : kOutTol);
            EXPECT_LE(max_diff(pb.f.lse, ref.f.lse), 2e-5);
            EXPECT_LE(max_diff(ent, ref_ent), input == 0 ? 2e-5 : 1e-3);
          }
          EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size() * sizeof(float)), 0)
              << threads << " threads";
        }
      }
  });
}

TEST(FlashBf16, ProbabilitiesFromTheFusedPath) {
  ThreadContext ctx(2);
  const AttentionShape shape{1, 4, 2, 45, 301, 40, 24};
  AttentionOptions o;
  o.causal = true;
  for (bool bf16_out : {false, true}) {  // the probabilities are float32 either way
    SCOPED_TRACE(bf16_out ? "bf16 output" : "float32 output");
    Bf16Problem ref(shape, 9), fused(shape, 9);
    AttentionParams pr = ref.params(o, bf16_out), pf = fused.params(o, bf16_out);
    pr.probs = ref.f.probs.data();
    pf.probs = fused.f.probs.data();
    reference::forward(pr);
    forward(ctx, pf, KernelChoice::fused);
    EXPECT_LE(max_diff(fused.f.probs, ref.f.probs), kRowTol);
    const std::vector<float> got = bf16_out ? widen(fused.out) : fused.f.out;
    const std::vector<float> want = bf16_out ? widen(ref.out) : ref.f.out;
    for (size_t i = 0; i < got.size(); ++i)  // each bf16 output rounded once
      ASSERT_LE(std::fabs(got[i] - want[i]), kOutTol + (bf16_out ? std::fabs(want[i]) / 128 : 0))
          << i;
  }
}

TEST(FlashBf16, BitwiseTheSameForAnyThreadCount) {
  const AttentionShape shape{2, 4, 2, 130, 700, 64, 64};
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadContext ctx(threads);
    Bf16Problem pb(shape, 3);
    cpu::flash_forward(ctx, pb.params({}, false));
    if (first.empty()) first = pb.f.out;
    EXPECT_EQ(std::memcmp(first.data(), pb.f.out.data(), first.size() * sizeof(float)), 0)
        << threads << " threads";
  }
}

TEST(FlashBf16, BackwardEqualsTheReferenceOnTheBf16ValuesForEveryOption) {
  // The fused bf16 backward against the reference (double on the bf16 values), every option, on
  // every path: bf16 products on AMX (where the CPU has it) and on vdpbf16ps (HEADLIGHT_ISA=
  // avx3_bf16, where the CPU has AVX-512 BF16): P', dS and an fp32 dO rounded to bf16 for the
  // products, each rounding 2⁻⁹ relative to a term of a sum that may cancel, so the bound is taken
  // as 1/64 of the gradient's scale (the Python tests hold the errors to 3× a plain bf16
  // implementation's); and the widened fp32 kernel (HEADLIGHT_ISA=avx3, or a CPU without either:
  // fp32 rounding only). Gradients into fp32 operands, and into bf16 ones (the same values rounded
  // once).
  ThreadContext ctx(2);
  for (const char* isa : {"best", "avx3_bf16", "avx3"}) {
    force_isa(isa);
    const bool bf16_products =
        cpu::bf16_backward_available(Bf16Problem({1, 1, 1, 1, 1, 1, 1}, 1).params({}, false));
    SCOPED_TRACE(::testing::Message()
                 << "isa " << isa << (bf16_products ? " (bf16 products)" : " (widened)"));
    const double tol = bf16_products ? 1.0 / 64 : 2e-5;
    for (const OptionCase& c : option_cases()) {
      SCOPED_TRACE(c.name);
      CaseData data;
      c.setup(data);
      Bf16Problem ref(c.shape, 41), fused(c.shape, 41), half(c.shape, 41);
      AttentionParams pr = ref.params(data.options, false);
      reference::backward(pr);
      // Without the forward's output the backward recomputes it.
      AttentionParams pf = fused.params(data.options, false);
      pf.out = {};
      pf.lse = nullptr;
      backward(ctx, pf, KernelChoice::fused);
      EXPECT_LE(rel_diff(fused.f.dq, ref.f.dq), tol);
      EXPECT_LE(rel_diff(fused.f.dk, ref.f.dk), tol);
      EXPECT_LE(rel_diff(fused.f.dv, ref.f.dv), tol);
      // With the bf16 forward's output and log-sum-exp (as training keeps them), D = dO·O carries
      // the forward's rounding of P (≤ 2⁻⁹·max|v| per output element): dQ and dK move by at most
      // that times Σ|dO| and the scores' gradients' sizes, here below 2·10⁻³.
      Bf16Problem kept(c.shape, 41);
      const AttentionParams pk = kept.params(data.options, false);
      forward(ctx, pk, KernelChoice::fused);
      backward(ctx, pk, KernelChoice::fused);
      EXPECT_LE(rel_diff(kept.f.dq, ref.f.dq), tol + 2e-3);
      EXPECT_LE(rel_diff(kept.f.dk, ref.f.dk), tol + 2e-3);
      EXPECT_LE(rel_diff(kept.f.dv, ref.f.dv), tol);
      AttentionParams ph = half.params(data.options, false);
      ph.out = {};
      ph.lse = nullptr;
      std::vector<bf16> dq(half.f.dq.size()), dk(half.f.dk.size()), dv(half.f.dv.size());
      const AttentionShape& s = c.shape;
      ph.dq = Bf16Problem::operand(dq, s.heads, s.len_q, s.head_dim);
      ph.dk = Bf16Problem::operand(dk, s.kv_heads, s.len_kv, s.head_dim);
      ph.dv = Bf16Problem::operand(dv, s.kv_heads, s.len_kv, s.value_dim);
      backward(ctx, ph, KernelChoice::fused);
      for (size_t i = 0; i < dq.size(); ++i) EXPECT_EQ(dq[i].bits, to_bf16(fused.f.dq[i]).bits);
      for (size_t i = 0; i < dk.size(); ++i) EXPECT_EQ(dk[i].bits, to_bf16(fused.f.dk[i]).bits);
      for (size_t i = 0; i < dv.size(); ++i) EXPECT_EQ(dv[i].bits, to_bf16(fused.f.dv[i]).bits);
    }
  }
  force_isa("best");
}

TEST(FlashBf16, QueriesReadInPlaceOrPackedGiveTheSameBits) {
  // Query rows that are whole 32-bit words (even head dim, even row stride, word-aligned) are
  // read where they lie; rows an odd number of elements apart, or starting between words, are
  // packed first. Both give the bits of contiguous queries, causal and not, with GQA, and so do
  // output rows that are not contiguous (nothing written between them).
  const AttentionShape s{2, 4, 2, 70, 90, 32, 24};
  ThreadContext ctx(2);
  for (const char* isa : {"best", "avx3_bf16"}) {
    force_isa(isa);
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << isa << (causal ? " causal" : ""));
      const AttentionOptions o{.causal = causal};
      Bf16Problem plain(s, 21);
      cpu::flash_forward(ctx, plain.params(o, true));
      for (const auto& [pad, shift] : {std::pair<int64_t, int64_t>{1, 0}, {2, 1}, {2, 0}}) {
        Bf16Problem moved(s, 21);
        // Rows of head_dim + pad elements, starting `shift` elements into the buffer.
        const int64_t row = s.head_dim + pad;
        std::vector<bf16> q(static_cast<size_t>(shift + s.batch * s.heads * s.len_q * row));
        for (int64_t r = 0; r < s.batch * s.heads * s.len_q; ++r)
          std::copy_n(moved.q.begin() + r * s.head_dim, s.head_dim, q.begin() + shift + r * row);
        AttentionParams p = moved.params(o, true);
        p.q = Operand{.batch_stride = s.heads * s.len_q * row,
                      .head_stride = s.len_q * row,
                      .row_stride = row,
                      .bf16 = q.data() + shift};
        // The output's rows `pad` elements apart too (a sentinel between them stays).
        const int64_t orow = s.value_dim + pad, nrows = s.batch * s.heads * s.len_q;
        std::vector<bf16> out(static_cast<size_t>(nrows * orow), bf16{0x7E7E});
        p.out = Operand{.batch_stride = s.heads * s.len_q * orow,
                        .head_stride = s.len_q * orow,
                        .row_stride = orow,
                        .bf16 = out.data()};
        cpu::flash_forward(ctx, p);
        for (int64_t r = 0; r < nrows; ++r)
          for (int64_t x = 0; x < orow; ++x)
            ASSERT_EQ(out[r * orow + x].bits,
                      x < s.value_dim ? plain.out[r * s.value_dim + x].bits : 0x7E7E)
                << "pad " << pad << " shift " << shift << " row " << r << " element " << x;
      }
    }
  }
  force_isa("best");
}

TEST(FlashBf16, DecodeFromACacheOfAnyLayout) {
  // Decode reads a bf16 cache where it lies: on vdpbf16ps when the key rows are whole 32-bit
  // words (prefetching rows that are not contiguous), with the widening loops when they are not
  // (rows an odd number of elements apart, or starting between words); the value rows may lie
  // anywhere. Every layout matches the reference,
  // for one query row (a group of 4 heads: the vdpbf16ps loops) and 4 rows (16 per group).
  ThreadContext ctx(2);
  for (const int64_t len_q : {1, 4}) {
    const AttentionShape s{1, 8, 2, len_q, 1100, 64, 64};
    Bf16Problem ref(s, 33);
    const AttentionOptions o{.causal = true, .alignment = Alignment::bottom_right};
    AttentionParams pr = ref.params(o, false);
    reference::forward(pr);
    for (const auto& [pad, shift] :
         {std::pair<int64_t, int64_t>{0, 0}, {2, 0}, {1, 0}, {2, 1}, {0, 1}}) {
      SCOPED_TRACE(::testing::Message() << "Lq " << len_q << " pad " << pad << " shift " << shift);
      Bf16Problem moved(s, 33);
      const int64_t row = s.head_dim + pad, nrows = s.batch * s.kv_heads * s.len_kv;
      std::vector<bf16> k(static_cast<size_t>(shift + nrows * row)), v(k.size());
      for (int64_t r = 0; r < nrows; ++r) {
        std::copy_n(moved.k.begin() + r * s.head_dim, s.head_dim, k.begin() + shift + r * row);
        std::copy_n(moved.v.begin() + r * s.value_dim, s.value_dim, v.begin() + shift + r * row);
      }
      AttentionParams p = moved.params(o, false);
      for (auto [x, buf] : {std::pair<Operand*, std::vector<bf16>*>{&p.k, &k}, {&p.v, &v}})
        *x = Operand{.batch_stride = s.kv_heads * s.len_kv * row,
                     .head_stride = s.len_kv * row,
                     .row_stride = row,
                     .bf16 = buf->data() + shift};
      for_each_path([&] {
        cpu::flash_forward(ctx, p);
        EXPECT_LE(max_diff(moved.f.out, ref.f.out), kOutTol);
        EXPECT_LE(max_diff(moved.f.lse, ref.f.lse), kRowTol);
      });
    }
  }
}

TEST(FlashBf16, StructuralLimitsInTheSoftmaxGiveTheMaskedBits) {
  // On a tile cut by the causal diagonal or the key lengths alone, the native softmax (and the
  // backward's P, on either engine) takes each row's last key as a limit instead of reading scores
  // made −inf by the masks. An all-allowed boolean mask forces the mask pass on every tile: the
  // same bits, forward and backward, top-left and bottom-right, with key lengths and a right
  // window (and a left window, which keeps the mask pass).
  const AttentionShape s{2, 4, 2, 150, 170, 64, 48};
  std::vector<uint8_t> all(static_cast<size_t>(s.len_q * s.len_kv), 1);
  const int64_t lengths[] = {170, 101};
  ThreadContext ctx(2);
  for (const char* isa : {"best", "avx3_bf16"}) {
    force_isa(isa);
    for (const Alignment a : {Alignment::top_left, Alignment::bottom_right})
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(::testing::Message()
                     << isa << " alignment " << static_cast<int>(a) << " variant " << variant);
        AttentionOptions o{.causal = variant != 2, .alignment = a};
        if (variant == 1) o.key_lengths = lengths;
        if (variant == 2) o.window_left = 30, o.window_right = 5;
        Bf16Problem plain(s, 8), masked(s, 8);
        auto run = [&](Bf16Problem& x) {
          cpu::flash_forward(ctx, x.params(o, true));
          AttentionParams p = x.params(o, false);  // the backward from the fp32 output and lse
          cpu::flash_forward(ctx, p);
          backward(ctx, p, KernelChoice::fused);
        };
        run(plain);
        o.mask = {.kind = MaskKind::boolean, .data = all.data(), .row_stride = s.len_kv};
        run(masked);
        for (size_t i = 0; i < plain.out.size(); ++i)
          ASSERT_EQ(plain.out[i].bits, masked.out[i].bits) << i;
        for (auto [got, want] : {std::pair{&masked.f.lse, &plain.f.lse},
                                 {&masked.f.dq, &plain.f.dq},
                                 {&masked.f.dk, &plain.f.dk},
                                 {&masked.f.dv, &plain.f.dv}})
          for (size_t i = 0; i < want->size(); ++i) ASSERT_EQ((*got)[i], (*want)[i]) << i;
      }
  }
  force_isa("best");
}

TEST(FlashBf16, BackwardReadsRowsInAnyLayoutWithTheSameBits) {
  // The backward's items read bf16 rows that are whole 32-bit words as words, other bf16 rows
  // element by element, and fp32 rows through one rounding each. Query rows an odd number of
  // elements apart or off word boundaries, and a bf16 output gradient holding the fp32 one's
  // values (representable in bf16), give the bits of contiguous rows.
  const AttentionShape s{2, 4, 2, 70, 90, 32, 24};
  const AttentionOptions o{.causal = true};
  ThreadContext ctx(2);
  // x's [batch, heads, rows, dim] rows as bf16 at `dim + pad` elements apart, `shift` elements in.
  auto spread = [&](const std::vector<bf16>& x, int64_t heads, int64_t dim, int64_t pad,
                    int64_t shift, std::vector<bf16>& buf) {
    const int64_t row = dim + pad, n = s.batch * heads * s.len_q;
    buf.assign(static_cast<size_t>(shift + n * row), bf16{});
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x.begin() + r * dim, dim, buf.begin() + shift + r * row);
    return Operand{.batch_stride = heads * s.len_q * row,
                   .head_stride = s.len_q * row,
                   .row_stride = row,
                   .bf16 = buf.data() + shift};
  };
  for (const char* isa : {"best", "avx3_bf16"}) {
    force_isa(isa);
    SCOPED_TRACE(isa);
    Bf16Problem plain(s, 33);
    std::vector<bf16> dout16(plain.f.dout.size());
    for (size_t i = 0; i < dout16.size(); ++i) {
      dout16[i] = to_bf16(plain.f.dout[i]);
      plain.f.dout[i] = to_float(dout16[i]);
    }
    AttentionParams pp = plain.params(o, false);
    cpu::flash_forward(ctx, pp);
    backward(ctx, pp, KernelChoice::fused);
    for (const auto& [pad, shift] : {std::pair<int64_t, int64_t>{1, 0}, {2, 1}, {0, 0}}) {
      SCOPED_TRACE(::testing::Message() << "pad " << pad << " shift " << shift);
      Bf16Problem moved(s, 33);
      moved.f.out = plain.f.out;
      moved.f.lse = plain.f.lse;
      std::vector<bf16> q, g;
      AttentionParams p = moved.params(o, false);
      p.q = spread(moved.q, s.heads, s.head_dim, pad, shift, q);
      p.dout = spread(dout16, s.heads, s.value_dim, pad, shift, g);
      backward(ctx, p, KernelChoice::fused);
      for (auto [got, want] : {std::pair{&moved.f.dq, &plain.f.dq},
                               {&moved.f.dk, &plain.f.dk},
                               {&moved.f.dv, &plain.f.dv}})
        for (size_t i = 0; i < want->size(); ++i) ASSERT_EQ((*got)[i], (*want)[i]) << i;
    }
  }
  force_isa("best");
}

TEST(FlashBf16, BackwardIntoStridedFp32Gradients) {
  // fp32 gradients whose rows are not contiguous (the GPT engine's dq, dk, dv are columns of one
  // [tokens, (H + 2·Hkv)·D] buffer): with one query chunk the items write dK and dV there
  // themselves. The same bits as into contiguous gradients, and nothing written between rows.
  const AttentionShape s{2, 4, 2, 70, 90, 32, 24};
  const AttentionOptions o{.causal = true};
  ThreadContext ctx(2);
  for (const char* isa : {"best", "avx3_bf16"}) {
    force_isa(isa);
    SCOPED_TRACE(isa);
    Bf16Problem plain(s, 12), strided(s, 12);
    backward(ctx, plain.params(o, false), KernelChoice::fused);
    AttentionParams p = strided.params(o, false);
    // Rows of pad + width floats, one (b, head) after another; the pad holds a sentinel.
    constexpr int64_t kPad = 7;
    constexpr float kSentinel = 12345.0f;
    auto wide = [&](std::vector<float>& buf, int64_t heads, int64_t rows, int64_t width) {
      buf.assign(static_cast<size_t>(s.batch * heads * rows * (width + kPad)), kSentinel);
      return Operand{.data = buf.data(),
                     .batch_stride = heads * rows * (width + kPad),
                     .head_stride = rows * (width + kPad),
                     .row_stride = width + kPad};
    };
    std::vector<float> dq, dk, dv;
    p.dq = wide(dq, s.heads, s.len_q, s.head_dim);
    p.dk = wide(dk, s.kv_heads, s.len_kv, s.head_dim);
    p.dv = wide(dv, s.kv_heads, s.len_kv, s.value_dim);
    backward(ctx, p, KernelChoice::fused);
    auto same = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t width) {
      for (size_t r = 0; r < want.size() / static_cast<size_t>(width); ++r)
        for (int64_t e = 0; e < width + kPad; ++e) {
          const float x = got[r * static_cast<size_t>(width + kPad) + static_cast<size_t>(e)];
          if (e < width)
            ASSERT_EQ(x, want[r * static_cast<size_t>(width) + static_cast<size_t>(e)]) << r;
          else
            ASSERT_EQ(x, kSentinel) << "written between rows at " << r;
        }
    };
    same(dq, plain.f.dq, s.head_dim);
    same(dk, plain.f.dk, s.head_dim);
    same(dv, plain.f.dv, s.value_dim);
  }
  force_isa("best");
}

TEST(FlashBf16, BackwardIsBitwiseTheSameForAnyThreadCountAndLongChunks) {
  // Several query chunks (their partial dK and dV added in order), GQA, causal; any thread count.
  // With one thread each item runs both chunks of its pair (merged), with more the chunks are
  // items of their own and their partials are added after: the same bits. bf16 gradients are the
  // fp32 ones rounded once, either way.
  const AttentionShape shape{1, 4, 2, 2100, 700, 64, 48};
  AttentionOptions o;
  o.causal = true;
  o.alignment = Alignment::bottom_right;
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadContext ctx(threads);
    Bf16Problem pb(shape, 8);
    AttentionParams p = pb.params(o, false);
    p.out = {};
    p.lse = nullptr;
    backward(ctx, p, KernelChoice::fused);
    std::vector<float> all = pb.f.dq;
    all.insert(all.end(), pb.f.dk.begin(), pb.f.dk.end());
    all.insert(all.end(), pb.f.dv.begin(), pb.f.dv.end());
    if (first.empty()) {
      first = all;
      Bf16Problem ref(shape, 8);
      AttentionParams pr = ref.params(o, false);
      reference::backward(pr);
      EXPECT_LE(rel_diff(pb.f.dq, ref.f.dq), 1.0 / 64);
      EXPECT_LE(rel_diff(pb.f.dk, ref.f.dk), 1.0 / 64);
      EXPECT_LE(rel_diff(pb.f.dv, ref.f.dv), 1.0 / 64);
    }
    EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size() * sizeof(float)), 0)
        << threads << " threads";
    std::vector<bf16> dq(pb.f.dq.size()), dk(pb.f.dk.size()), dv(pb.f.dv.size());
    p.dq = Bf16Problem::operand(dq, shape.heads, shape.len_q, shape.head_dim);
    p.dk = Bf16Problem::operand(dk, shape.kv_heads, shape.len_kv, shape.head_dim);
    p.dv = Bf16Problem::operand(dv, shape.kv_heads, shape.len_kv, shape.value_dim);
    backward(ctx, p, KernelChoice::fused);
    size_t off = 0;
    for (size_t i = 0; i < dq.size(); ++i) ASSERT_EQ(dq[i].bits, to_bf16(all[i]).bits) << i;
    off += dq.size();
    for (size_t i = 0; i < dk.size(); ++i)
      ASSERT_EQ(dk[i].bits, to_bf16(all[off + i]).bits) << threads << " threads, dk " << i;
    off += dk.size();
    for (size_t i = 0; i < dv.size(); ++i)
      ASSERT_EQ(dv[i].bits, to_bf16(all[off + i]).bits) << threads << " threads, dv " << i;
  }
}

TEST(FlashBf16, MixedDtypesAreRefusedByName) {
  ThreadContext ctx(1);
  const AttentionShape shape{1, 1, 1, 4, 4, 8, 8};
  Bf16Problem pb(shape, 1);
  AttentionParams p = pb.params({}, false);
  p.k = Problem::operand(pb.f.k, 1, 4, 8);  // fp32 keys with bf16 queries
  try {
    cpu::flash_forward(ctx, p);
    FAIL() << "mixed dtypes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q, k and v must have one dtype"), std::string::npos)
        << e.what();
  }
  AttentionParams f32 = pb.f.params({});
  f32.probs = nullptr;
  f32.out = Bf16Problem::operand(pb.out, 1, 4, 8);
  EXPECT_THROW(cpu::flash_forward(ctx, f32), Error);
  AttentionParams back = pb.f.params({});  // fp32 inputs, a bf16 gradient
  back.dq = Bf16Problem::operand(pb.q, 1, 4, 8);
  try {
    backward(ctx, back);
    FAIL() << "bf16 gradient of fp32 inputs accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 gradients need bf16 inputs"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace headlight::attention

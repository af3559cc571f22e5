// The bf16 online softmax's special rows (native::softmax_rows, flash_bf16.h) through the fused
// forward on every path this CPU has: NaN scores stay in the rows that see them, and scores far
// above a row's first maximum (the lazy reference maximum) give the reference's values; on AMX,
// the one-pass tiles (amx::qk_exp_tile; the backward's amx::backward_probs and backward_dscores)
// give the two-pass tiles' bits. The bounds are flash_bf16_test.cc's.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_test_util.h"
#include "bf16_problem.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/dispatch.h"
#include "headlight/attention/reference.h"
#include "headlight/core/bf16.h"

namespace headlight::attention {
namespace {

using testing::Bf16Problem;
using testing::for_each_path;
using testing::max_diff;
using testing::Problem;

constexpr double kOutTol = testing::kBf16OutTol;
constexpr double kRowTol = testing::kBf16RowTol;

TEST(FlashBf16, NanStaysInTheRowsThatSeeIt) {
  // Causal, 2 heads of 70 rows: in head 0 key 5 is NaN (rows 5 on see it, rows 0-4 must stay
  // numbers), in head 1 query row 0 is (its one key's score is NaN beside the causal −inf ones,
  // which pass A's vmaxps may keep in its place: the row must still come out NaN).
  const AttentionShape shape{1, 2, 2, 70, 70, 32, 32};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for_each_path([&] {
    ThreadContext ctx(2);
    Bf16Problem x(shape, 71);
    for (int64_t e = 0; e < shape.head_dim; ++e) {
      x.k[5 * shape.head_dim + e] = to_bf16(nan);                  // head 0, key 5
      x.q[(shape.len_q + 0) * shape.head_dim + e] = to_bf16(nan);  // head 1, row 0
    }
    cpu::flash_forward(ctx, x.params({.causal = true}, false));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < shape.len_q; ++i) {
        const bool want_nan = h == 0 ? i >= 5 : i == 0;
        const float* row = x.f.out.data() + (h * shape.len_q + i) * shape.value_dim;
        for (int64_t e = 0; e < shape.value_dim; ++e)
          ASSERT_EQ(std::isnan(row[e]), want_nan) << "head " << h << " row " << i << " col " << e;
      }
  });
}

TEST(FlashBf16, ScoresFarAboveARowsFirstMaximum) {
  // The bf16 softmax keeps a row's first maximum as its reference (flash_bf16.h, kLazyBound):
  // later scores above it give P > 1, and one far above it makes the row start again from its
  // true maximum. 600 keys (three key blocks of 256), D = 32, the first element of every query
  // row of head 0 is 16: key 300's score is about 3 above the first block's scores (P up to
  // about 2⁴, kept), key 550's about 130 above (2^190 against the first reference: the row is
  // computed again and O rescaled, or it overflows); head 1 as generated. Without a mask and
  // causal aligned bottom-right (every row sees both keys).
  const AttentionShape shape{1, 2, 2, 40, 600, 32, 32};
  const int64_t D = shape.head_dim;
  auto set = [](Bf16Problem& x, std::vector<bf16> Bf16Problem::*v, std::vector<float> Problem::*f,
                int64_t i, float value) {
    (x.*v)[i] = to_bf16(value);
    (x.f.*f)[i] = value;
  };
  for (const bool causal : {false, true})
    for_each_path([&] {
      SCOPED_TRACE(causal ? "causal" : "no mask");
      const AttentionOptions options{.causal = causal, .alignment = Alignment::bottom_right};
      ThreadContext ctx(2);
      Bf16Problem ref(shape, 89), fused(shape, 89);
      for (Bf16Problem* x : {&ref, &fused}) {
        for (int64_t i = 0; i < shape.len_q; ++i) set(*x, &Bf16Problem::q, &Problem::q, i * D, 16);
        set(*x, &Bf16Problem::k, &Problem::k, 300 * D, 2);
        set(*x, &Bf16Problem::k, &Problem::k, 550 * D, 48);
      }
      AttentionParams pr = ref.params(options, false);
      reference::forward(pr);
      cpu::flash_forward(ctx, fused.params(options, false));
      EXPECT_LE(max_diff(fused.f.out, ref.f.out), kOutTol);
      // Head 0's log-sum-exp is about 136: a few of its fp32 ulps (1.5·10⁻⁵) on every path.
      EXPECT_LE(max_diff(fused.f.lse, ref.f.lse), 8 * kRowTol);
    });
}

TEST(FlashBf16, WeightsSumToOneWherePIsRounded) {
  // P is rounded to bf16 for P·V; the output is divided by the sum of P as rounded
  // (Plan::rounded_sums), so the weights it applies sum to 1: where every key's value row is the
  // same u, the output is u to fp32 rounding (and a bf16 output u's bits). Divided by the
  // unrounded sum it would be u times Σ rounded P / Σ P, off by up to 2⁻⁹ (about 10⁻³ here).
  // Packed tiles (causal and not, 300 keys past a tile of 256; Dv = 40, rows written one by one
  // on the portable paths), and decode's loops (4 query heads over 1, one row; a blocked cache
  // and rows) on every path, AMX's one-pass tiles (amx::qk_exp_tile, commit_tile_sums) too.
  struct Case {
    AttentionShape shape;
    bool causal, blocked;
  };
  const Case cases[] = {{{1, 2, 2, 70, 300, 64, 64}, false, false},
                        {{1, 2, 1, 300, 300, 32, 40}, true, false},
                        {{1, 4, 1, 1, 1025, 128, 128}, false, false},
                        {{1, 4, 1, 1, 1025, 128, 128}, false, true}};
  for (const Case& c : cases)
    for_each_path([&] {
      const AttentionShape& s = c.shape;
      SCOPED_TRACE(::testing::Message() << "Lq " << s.len_q << " Lk " << s.len_kv << " D "
                                        << s.head_dim << (c.blocked ? " blocked" : ""));
      ThreadContext ctx(2);
      Bf16Problem x(s, 113);
      for (bf16& q : x.q) q = to_bf16(4.0f * to_float(q));  // peaked rows: P far from uniform
      std::vector<float> u(static_cast<size_t>(s.value_dim));
      for (int64_t e = 0; e < s.value_dim; ++e)
        u[static_cast<size_t>(e)] = 0.25f * static_cast<float>(e % 7) - 0.625f;
      for (int64_t j = 0; j < s.kv_heads * s.len_kv; ++j)
        for (int64_t e = 0; e < s.value_dim; ++e)
          x.v[static_cast<size_t>(j * s.value_dim + e)] = to_bf16(u[static_cast<size_t>(e)]);
      cpu::flash_forward(ctx, x.params({.causal = c.causal}, false, c.blocked));
      cpu::flash_forward(ctx, x.params({.causal = c.causal}, true, c.blocked));
      double worst = 0;
      size_t off = 0;
      for (size_t i = 0; i < x.f.out.size(); ++i) {
        const float want = u[i % static_cast<size_t>(s.value_dim)];
        worst = std::max(worst, std::fabs(double(x.f.out[i]) - want));
        off += to_float(x.out[i]) != want;
      }
      EXPECT_LE(worst, 1e-6);
      EXPECT_EQ(off, 0u) << "bf16 outputs other than u";
    });
}

TEST(FlashBf16, ScoresAndTheirExponentialsInOnePassGiveTheSameBits) {
  // On AMX a whole tile without masks goes through amx::qk_exp_tile: the scores exponentiated as
  // each 2 × 2 block of tiles leaves the matrix unit (a row's first maximum from its first
  // block), the same maxima, P and sums as softmax_rows. A boolean mask
  // that allows every key sends every tile through qk_tile and softmax_rows instead: the outputs
  // (bf16 and fp32) and log-sum-exps must be the same bits. Shapes: rows that leave a tile of 16
  // alone (200, 130, 100), 64 keys in a last block (320), GQA, D = 32 to 128; one head with a key
  // far above its rows' first maximum in a whole block, where the one-pass tile gives way to
  // softmax_rows (a sum past kLazyBound).
  const AttentionShape shapes[] = {{1, 2, 2, 200, 768, 64, 64},
                                   {1, 4, 2, 130, 512, 128, 128},
                                   {2, 2, 2, 48, 320, 32, 32},
                                   {1, 1, 1, 100, 512, 96, 96}};
  for (const AttentionShape& s : shapes)
    for_each_path([&] {
      SCOPED_TRACE(::testing::Message()
                   << "Lq " << s.len_q << " Lk " << s.len_kv << " D " << s.head_dim);
      ThreadContext ctx(2);
      const std::vector<uint8_t> all(static_cast<size_t>(s.len_q * s.len_kv), 1);
      Bf16Problem plain(s, 97), masked(s, 97);
      for (Bf16Problem* x : {&plain, &masked})  // head 0's key 600 far above the rest
        if (s.len_kv > 600)
          for (int64_t e = 0; e < s.head_dim; ++e) x->k[600 * s.head_dim + e] = to_bf16(16.0f);
      AttentionOptions o;
      for (const bool bf16_out : {true, false}) {
        o.mask = {};
        cpu::flash_forward(ctx, plain.params(o, bf16_out));
        o.mask = {.kind = MaskKind::boolean, .data = all.data(), .row_stride = s.len_kv};
        cpu::flash_forward(ctx, masked.params(o, bf16_out));
        if (bf16_out)
          for (size_t i = 0; i < plain.out.size(); ++i)
            ASSERT_EQ(plain.out[i].bits, masked.out[i].bits) << i;
        else
          for (size_t i = 0; i < plain.f.out.size(); ++i)
            ASSERT_EQ(plain.f.out[i], masked.f.out[i]) << i;
        for (size_t i = 0; i < plain.f.lse.size(); ++i)
          ASSERT_EQ(plain.f.lse[i], masked.f.lse[i]) << i;
      }
    });
}

TEST(FlashBf16, BackwardScoreTilesInOnePassGiveTheSameBits) {
  // On AMX the bf16 backward's tiles without dropout, soft-cap or element masks run S → P and
  // dP → dS in one pass each (amx::backward_probs, backward_dscores); a boolean mask that allows
  // every key sends every tile through qk_tile, exp_shift_rows, softmax_grad_tile, row_pairs and
  // round_tile_bf16 instead: dQ, dK and dV must be the same bits. Rows that leave a lone tile of
  // 16 (200, 130, 100, 47), keys in a short last block (320, 700, 90), GQA, D = 32 to 128, and
  // causal both alignments (rows with no key at all: lse −inf; the rows' limits on the diagonal);
  // query row 7 of head 0 has a NaN (lse NaN: its P and dS NaN), compared bit for bit.
  const AttentionShape shapes[] = {{1, 2, 2, 200, 768, 64, 64},
                                   {1, 4, 2, 130, 700, 128, 96},
                                   {2, 2, 2, 48, 320, 32, 32},
                                   {1, 1, 1, 100, 90, 96, 96},
                                   {1, 2, 1, 47, 300, 64, 32}};
  for (const AttentionShape& s : shapes)
    for (const bool causal : {false, true})
      for (const Alignment align : {Alignment::top_left, Alignment::bottom_right}) {
        if (!causal && align == Alignment::bottom_right) continue;
        SCOPED_TRACE(::testing::Message() << "Lq " << s.len_q << " Lk " << s.len_kv << " D "
                                          << s.head_dim << (causal ? " causal" : ""));
        ThreadContext ctx(2);
        const std::vector<uint8_t> all(static_cast<size_t>(s.len_q * s.len_kv), 1);
        Bf16Problem plain(s, 53), masked(s, 53);
        for (Bf16Problem* x : {&plain, &masked})
          x->q[7 * s.head_dim] = to_bf16(std::numeric_limits<float>::quiet_NaN());
        AttentionOptions o{.causal = causal, .alignment = align};
        AttentionParams pp = plain.params(o, false);
        o.mask = {.kind = MaskKind::boolean, .data = all.data(), .row_stride = s.len_kv};
        AttentionParams pm = masked.params(o, false);
        for (AttentionParams* p : {&pp, &pm}) {
          p->out = {};
          p->lse = nullptr;
        }
        backward(ctx, pp, KernelChoice::fused);
        backward(ctx, pm, KernelChoice::fused);
        auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
          return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same_bits(plain.f.dq, masked.f.dq)) << "dq";
        EXPECT_TRUE(same_bits(plain.f.dk, masked.f.dk)) << "dk";
        EXPECT_TRUE(same_bits(plain.f.dv, masked.f.dv)) << "dv";
        // Row 7 is NaN where it sees a key (bottom-right with more rows than keys: it has none).
        if (!causal || align == Alignment::top_left || 7 + s.len_kv >= s.len_q)
          EXPECT_TRUE(std::isnan(plain.f.dq[7 * s.head_dim]));
      }
}

}  // namespace
}  // namespace headlight::attention

// The blocked key/value layout (attention/kv_layout.h): its indexing, the calls that read it as
// rows (the same bits as rows), and the inputs it refuses. Decode reading it in place is tested
// with every option in flash_bf16_test.cc (DecodeFromABf16CacheForEveryOption).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "bf16_problem.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/dispatch.h"
#include "headlight/attention/kv_layout.h"
#include "headlight/attention/reference.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

namespace headlight::attention {
namespace {

using testing::Bf16Problem;
using testing::max_diff;
using testing::Problem;

TEST(KvBlocked, IndexesFillEachRegionOnceAndRoundTrip) {
  for (const int64_t dim : {32, 64, 96, 128, 160}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    const int64_t keys = 300, cap = blocked_capacity(keys);
    EXPECT_EQ(cap, 512);
    EXPECT_EQ(blocked_region_elements(keys, dim), cap * dim);
    for (const KvSide side : {KvSide::keys, KvSide::values}) {
      std::set<int64_t> seen;
      for (int64_t j = 0; j < cap; ++j)
        for (int64_t e = 0; e < dim; ++e) {
          const int64_t at =
              side == KvSide::keys ? blocked_key_index(j, e, dim) : blocked_value_index(j, e, dim);
          ASSERT_GE(at, 0);
          ASSERT_LT(at, cap * dim);
          seen.insert(at);
        }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), cap * dim);
      // Rows in, rows out: a prefill of 290 keys, then 10 more one at a time.
      std::vector<bf16> rows(static_cast<size_t>(keys * dim)), back(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = to_bf16(static_cast<float>(i % 251) - 125);
      std::vector<bf16> region(static_cast<size_t>(cap * dim));
      write_blocked_rows(side, rows.data(), dim, 0, 290, dim, region.data());
      for (int64_t j = 290; j < keys; ++j)
        write_blocked_rows(side, rows.data() + j * dim, dim, j, 1, dim, region.data());
      read_blocked_rows(side, region.data(), 0, keys, dim, back.data(), dim);
      EXPECT_EQ(std::memcmp(rows.data(), back.data(), rows.size() * sizeof(bf16)), 0);
    }
  }
  // The keys' pair words: key 17's elements 6 and 7 are the second group's pair 3, lane 1.
  EXPECT_EQ(blocked_key_index(17, 6, 64), ((1 * 32 + 3) * 16 + 1) * 2);
  EXPECT_EQ(blocked_key_index(17, 7, 64), ((1 * 32 + 3) * 16 + 1) * 2 + 1);
  // The values' pair words: key 259 (chunk 1, pair 1, odd), element 70 of 128 (slab 1, 6).
  EXPECT_EQ(blocked_value_index(259, 70, 128), (((1 * 2 + 1) * 128 + 1) * 64 + 6) * 2 + 1);
  // An odd multiple of 32 takes slabs of 32: element 70 of 96 is slab 2, 6.
  EXPECT_EQ(blocked_value_index(259, 70, 96), (((1 * 3 + 2) * 128 + 1) * 32 + 6) * 2 + 1);
}

TEST(KvBlocked, OtherCallsReadItAsRows) {
  // Calls off decode's in-place loops (64 query rows; the probabilities of a forward; the
  // dispatcher's reference choice) read a blocked cache through a row copy: the same bits as the
  // same call on rows.
  const AttentionShape shape{1, 4, 2, 64, 300, 64, 64};
  const AttentionOptions o{.causal = true, .alignment = Alignment::bottom_right};
  ThreadContext ctx(2);
  Bf16Problem rows(shape, 5), blocked(shape, 5);
  AttentionParams pr = rows.params(o, false), pb = blocked.params(o, false, true);
  std::vector<float> probs_r(rows.f.probs.size()), probs_b(probs_r.size());
  pr.probs = probs_r.data();
  pb.probs = probs_b.data();
  for (const KernelChoice choice : {KernelChoice::fused, KernelChoice::reference}) {
    forward(ctx, pr, choice);
    forward(ctx, pb, choice);
    EXPECT_EQ(max_diff(blocked.f.out, rows.f.out), 0.0);
    EXPECT_EQ(max_diff(blocked.f.lse, rows.f.lse), 0.0);
    EXPECT_EQ(max_diff(probs_b, probs_r), 0.0);
  }
}

TEST(KvBlocked, RefusesWhatItCannotHold) {
  ThreadContext ctx(1);
  auto message = [&](AttentionParams p, bool backward) {
    try {
      if (backward)
        attention::backward(ctx, p);
      else
        cpu::flash_forward(ctx, p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {  // float32 operands
    Problem f({1, 2, 1, 1, 40, 64, 64}, 3);
    AttentionParams p = f.params();
    p.probs = nullptr;
    p.kv_layout = KvLayout::blocked;
    p.k.head_stride = p.v.head_stride = blocked_region_elements(40, 64);
    EXPECT_NE(message(p, false).find("kv_layout blocked needs a bf16 cache"), std::string::npos);
  }
  {  // a head dim that is not a multiple of 32
    Bf16Problem b({1, 2, 1, 1, 40, 64, 64}, 3);
    AttentionParams p = b.params({}, false, true);
    p.shape.head_dim = p.shape.value_dim = 48;
    EXPECT_NE(message(p, false).find("multiples of 32"), std::string::npos);
  }
  {  // regions smaller than the capacity
    Bf16Problem b({1, 2, 2, 1, 300, 64, 64}, 3);
    AttentionParams p = b.params({}, false, true);
    p.k.head_stride = 300 * 64;
    EXPECT_NE(message(p, false).find("blocked_region_elements"), std::string::npos);
  }
  {  // a backward
    Bf16Problem b({1, 2, 1, 1, 40, 64, 64}, 3);
    AttentionParams p = b.params({}, false, true);
    EXPECT_NE(message(p, true).find("kv_layout blocked is a decode cache"), std::string::npos);
  }
}

}  // namespace
}  // namespace headlight::attention

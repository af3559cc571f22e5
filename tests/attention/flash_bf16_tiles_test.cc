// The bf16 forward's choices of where its tile operands lie, which must never change the bits:
// query rows read in place by the AMX tiles (whole tiles of rows on cache lines) or packed, and
// the accumulators of an item written by its first key block's P·V or zeroed when it has none.
// On a CPU without AMX both sides of each comparison take the same path.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_test_util.h"
#include "bf16_problem.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/reference.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"

namespace headlight::attention {
namespace {

using testing::Bf16Problem;

// bf16 storage for n elements whose first lies `shift` elements past a 64-byte boundary.
struct Placed {
  Placed(size_t n, int64_t shift) : buf(n + 64) {
    const auto misalign = reinterpret_cast<uintptr_t>(buf.data()) % 64;
    at = buf.data() + (misalign ? (64 - misalign) / sizeof(bf16) : 0) + shift;
  }
  std::vector<bf16> buf;
  bf16* at = nullptr;
};

TEST(FlashBf16Tiles, QueriesOnCacheLinesOrNotGiveTheSameBits) {
  // Queries copied into rows `row` elements apart from an element `shift` past a cache line: the
  // AMX tiles read them in place when rows and start lie on lines (shift 0, row a multiple of
  // 32) and the item's rows are whole tiles of 16, else pack them. 168 rows: items of 128 and
  // 40 rows (the last packed either way); head dims 32, 64 and 128 (pairs with no padding), and
  // 48 (padded to 32 pairs: packed); GQA; no mask, causal, and a window.
  ThreadContext ctx(2);
  for (const int64_t D : {32, 48, 64, 128}) {
    const AttentionShape s{1, 4, 2, 168, 300, D, 64};
    for (const int kind : {0, 1, 2}) {
      const AttentionOptions o{.causal = kind == 1, .window_left = kind == 2 ? 40 : -1};
      SCOPED_TRACE(::testing::Message() << "D " << D << " mask " << kind);
      Bf16Problem plain(s, 5);
      std::vector<float> lse_plain(static_cast<size_t>(s.heads * s.len_q));
      AttentionParams pp = plain.params(o, true);
      pp.lse = lse_plain.data();
      cpu::flash_forward(ctx, pp);
      for (const auto& [row, shift] : {std::pair<int64_t, int64_t>{D, 0}, {D + 32, 0}, {D, 8}}) {
        Bf16Problem moved(s, 5);
        const int64_t rows = s.batch * s.heads * s.len_q;
        Placed q(static_cast<size_t>(rows * row), shift);
        for (int64_t r = 0; r < rows; ++r) std::copy_n(moved.q.begin() + r * D, D, q.at + r * row);
        std::vector<float> lse(lse_plain.size());
        AttentionParams p = moved.params(o, true);
        p.q = Operand{.batch_stride = s.heads * s.len_q * row,
                      .head_stride = s.len_q * row,
                      .row_stride = row,
                      .bf16 = q.at};
        p.lse = lse.data();
        cpu::flash_forward(ctx, p);
        for (size_t i = 0; i < moved.out.size(); ++i)
          ASSERT_EQ(moved.out[i].bits, plain.out[i].bits)
              << "row " << row << " shift " << shift << " element " << i;
        ASSERT_EQ(std::memcmp(lse.data(), lse_plain.data(), lse.size() * sizeof(float)), 0)
            << "row " << row << " shift " << shift;
      }
    }
  }
}

TEST(FlashBf16Tiles, ItemsThatSeeNoKeysLeaveZeros) {
  // Causal aligned bottom-right with 300 query rows and 100 keys: rows 0-199 see no key, so the
  // first item (128 rows on AMX) visits no key block and its accumulators are never written by a
  // P·V; its rows must come out 0 with lse −inf, whatever the scratch held (a call before fills it
  // with another problem's state). The rows that see keys match the reference.
  const AttentionShape s{1, 2, 2, 300, 100, 64, 64};
  ThreadContext ctx(2);
  testing::for_each_path([&] {
    Bf16Problem dirty({1, 2, 2, 300, 300, 64, 64}, 7);
    cpu::flash_forward(ctx, dirty.params({}, false));
    Bf16Problem x(s, 8);
    std::vector<float> lse(static_cast<size_t>(s.heads * s.len_q));
    AttentionParams p = x.params({.causal = true, .alignment = Alignment::bottom_right}, false);
    p.lse = lse.data();
    cpu::flash_forward(ctx, p);
    const int64_t first_seen = s.len_q - s.len_kv;
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < first_seen; ++i) {
        ASSERT_EQ(lse[h * s.len_q + i], -INFINITY) << "head " << h << " row " << i;
        for (int64_t e = 0; e < s.value_dim; ++e)
          ASSERT_EQ(x.f.out[(h * s.len_q + i) * s.value_dim + e], 0.0f)
              << "head " << h << " row " << i << " element " << e;
      }
    Bf16Problem ref(s, 8);
    AttentionParams pr = ref.params(p.options, false);
    reference::forward(pr);
    EXPECT_LE(testing::max_diff(x.f.out, ref.f.out), testing::kBf16OutTol);
  });
}

}  // namespace
}  // namespace headlight::attention

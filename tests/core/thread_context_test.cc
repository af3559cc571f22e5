#include "headlight/core/thread_context.h"

#include <gtest/gtest.h>

#include <vector>

#include "headlight/core/cpu_info.h"

namespace headlight {
namespace {

TEST(ThreadContext, PartitionCoversEverythingOnce) {
  for (int64_t n : {0, 1, 7, 64, 1000}) {
    for (int parts : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int p = 0; p < parts; ++p) {
        Range r = ThreadContext::partition(n, parts, p);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.size(), n / parts);
        EXPECT_LE(r.size(), n / parts + 1);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(ThreadContext, ParallelForVisitsEachItem) {
  ThreadContext ctx(3);
  std::vector<int> hits(100, 0);
  ctx.parallel_for(100, [&](Range r, int) {
    for (int64_t i = r.begin; i < r.end; ++i) hits[static_cast<size_t>(i)] += 1;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

TEST(ThreadContext, ScratchIsAlignedAndReused) {
  ThreadContext ctx(2);
  float* a = ctx.scratch(1).floats(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  float* b = ctx.scratch(1).floats(500);
  EXPECT_EQ(a, b);
}

TEST(CpuInfo, ReportsATargetAndAPositivePeak) {
  CpuInfo info = cpu_info();
  EXPECT_FALSE(info.best_target.empty());
  ThreadContext ctx(1);
  PeakMeasurement peak = measure_fma_peak(ctx, 1, 0.01);
  EXPECT_GT(peak.gflops, 0.5);
  EXPECT_GE(peak.lanes, 1);
}

}  // namespace
}  // namespace headlight

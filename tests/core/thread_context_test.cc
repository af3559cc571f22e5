#include "headlight/core/thread_context.h"

#include <gtest/gtest.h>

#include <stdexcept>
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

// parallel_parts: with the thread count dividing the parts, worker w runs parts w, w + T, … on a
// single-thread context of its own (the same one each time, kept); otherwise every part runs on
// the context itself, in order. An exception in a part comes out of the call after every other
// part has run.
TEST(ThreadContext, ParallelPartsRunsWholePartsOnSingleThreadContexts) {
  ThreadContext ctx(2);
  std::vector<int> hits(6, 0), worker(6, -1);
  std::vector<ThreadContext*> used(6, nullptr);
  ctx.parallel_parts(6, [&](int64_t i, ThreadContext& pc) {
    hits[static_cast<size_t>(i)] += 1;
    worker[static_cast<size_t>(i)] = omp_get_thread_num();
    used[static_cast<size_t>(i)] = &pc;
    EXPECT_EQ(pc.num_threads(), 1);
  });
  const std::vector<ThreadContext*> singles = ctx.singles();
  ASSERT_EQ(singles.size(), 2u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(hits[i], 1) << i;
    EXPECT_EQ(worker[i], static_cast<int>(i % 2)) << i;
    EXPECT_EQ(used[i], singles[i % 2]) << i;
  }
  std::vector<int64_t> order;
  ctx.parallel_parts(3, [&](int64_t i, ThreadContext& pc) {  // 3 parts on 2 threads: in turn
    order.push_back(i);
    EXPECT_EQ(&pc, &ctx);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2}));
  std::vector<int> done(4, 0);
  EXPECT_THROW(ctx.parallel_parts(4,
                                  [&](int64_t i, ThreadContext&) {
                                    if (i == 1) throw std::runtime_error("part 1");
                                    done[static_cast<size_t>(i)] = 1;
                                  }),
               std::runtime_error);
  EXPECT_EQ(done, (std::vector<int>{1, 0, 1, 0}));  // worker 1 stopped at its first part
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

TEST(ReadPass, ReadsEveryWholePieceOnEveryThreadAndNoTail) {
  // 3 whole pieces of 1,024 floats and a tail of 100: the sums cover the pieces (each element
  // 1, exact in float), the tail is not read; less than a piece reads nothing.
  std::vector<float> x(3 * 1024 + 100, 1.0f);
  for (size_t i = 3 * 1024; i < x.size(); ++i) x[i] = 1000.0f;  // would show in the sums
  for (int threads : {1, 2}) {
    ThreadContext ctx(threads);
    std::vector<float> sinks;
    EXPECT_GT(read_pass(ctx, x.data(), x.size() * sizeof(float), sinks), 0.0);
    ASSERT_GE(sinks.size(), static_cast<size_t>(threads));
    float total = 0;
    for (float s : sinks) total += s;
    EXPECT_EQ(total, 3 * 1024.0f) << threads;
    EXPECT_EQ(read_pass(ctx, x.data(), 1023 * sizeof(float), sinks), 0.0);
    total = 0;
    for (float s : sinks) total += s;
    EXPECT_EQ(total, 3 * 1024.0f) << threads;  // unchanged
  }
}

}  // namespace
}  // namespace headlight

#include "headlight/bench/benchmarks.h"

#include <vector>

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/ops/matmul.h"

namespace headlight::bench {

PeakReport measure_peak(int threads, int repeats) {
  check(threads > 0, "threads: must be positive, got {}", threads);
  ThreadContext ctx(threads);
  PeakMeasurement m = measure_fma_peak(ctx, repeats);
  return PeakReport{m.gflops, threads, cpu_info().best_target};
}

MatmulBenchReport bench_matmul(const MatmulBenchConfig& c) {
  check(c.m > 0 && c.n > 0 && c.k > 0, "matmul bench: m, n, k must be positive, got {}, {}, {}",
        c.m, c.n, c.k);
  check(c.threads > 0, "threads: must be positive, got {}", c.threads);
  MatmulBenchReport r;
  r.config = c;
  ThreadContext ctx(c.threads);
  Generator g(1);
  std::vector<float> a(static_cast<size_t>(c.m * c.k)), b(static_cast<size_t>(c.k * c.n));
  std::vector<float> out(static_cast<size_t>(c.m * c.n));
  for (auto& x : a) x = g.uniform(-1, 1);
  for (auto& x : b) x = g.uniform(-1, 1);
  const ops::MatrixArg bm = c.transpose_b ? ops::MatrixArg{b.data(), c.k, c.n, c.k, true}
                                          : ops::MatrixArg{b.data(), c.k, c.n, c.n, false};
  r.peak = measure_peak(c.threads);
  r.timing = time_runs(
      [&] {
        ops::matmul(ctx, {a.data(), c.m, c.k, c.k, false}, bm, {out.data(), c.n});
      },
      c.warmup, c.runs);
  r.flops = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  r.gflops = r.flops / r.timing.median * 1e-9;
  r.fraction_of_peak = r.gflops / r.peak.gflops;
  return r;
}

}  // namespace headlight::bench

// Benchmarks behind `headlight bench …`: each measures the FP32 FMA peak in the same run and
// reports its GFLOP/s (from an explicit FLOP formula) as a fraction of it.
#pragma once

#include <cstdint>
#include <string>

#include "headlight/core/timing.h"

namespace headlight::bench {

struct PeakReport {
  double gflops = 0;
  int threads = 1;
  std::string target;  // SIMD target of the probe
};

// The FMA peak on `threads` threads (best of `repeats`).
PeakReport measure_peak(int threads, int repeats = 7);

struct MatmulBenchConfig {
  int64_t m = 512, n = 2304, k = 768;  // C[m, n] = A[m, k] · B[k, n]
  bool transpose_b = true;             // B stored [n, k], as a linear layer's weight
  int threads = 2;
  int warmup = 2;
  int runs = 9;
};

struct MatmulBenchReport {
  MatmulBenchConfig config;
  Timing timing;
  double flops = 0;   // 2·m·n·k
  double gflops = 0;  // at the median time
  PeakReport peak;
  double fraction_of_peak = 0;
};

MatmulBenchReport bench_matmul(const MatmulBenchConfig& config);

}  // namespace headlight::bench

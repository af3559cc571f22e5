// What this CPU is and what it can do: the SIMD target Highway dispatches to, and the FP32 FMA peak
// measured by a microbenchmark, so that benchmarks report a fraction of the peak of the same run.
#pragma once

#include <string>
#include <vector>

#include "headlight/core/thread_context.h"

namespace headlight {

struct CpuInfo {
  std::string model_name;                      // from /proc/cpuinfo, or "unknown"
  std::string best_target;                     // the Highway target dynamic dispatch picks
  std::vector<std::string> supported_targets;  // compiled in and supported here, best first
  int hardware_threads = 1;
};

CpuInfo cpu_info();

struct PeakMeasurement {
  double gflops = 0;  // the best of the repeats
  int threads = 1;
  int lanes = 1;  // float lanes of the dispatched target
};

// FP32 fused multiply-add peak on ctx.num_threads() threads: independent FMA chains in registers,
// the best of `repeats` runs of about `seconds_per_repeat` each.
PeakMeasurement measure_fma_peak(ThreadContext& ctx, int repeats = 5,
                                 double seconds_per_repeat = 0.05);

}  // namespace headlight

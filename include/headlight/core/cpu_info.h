// What this CPU is and what it can do: the SIMD target Highway dispatches to, and the FP32 FMA peak
// measured by a microbenchmark, so that benchmarks report a fraction of the peak of the same run.
#pragma once

#include <string>
#include <string_view>
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

// Restricts Highway's dynamic dispatch to compiled targets no better than `isa`: "avx3", "avx2",
// "sse4", "scalar", or "" / "best" for no restriction. For tests and comparisons; it changes
// Highway's process-wide choice (the one piece of global state, owned by Highway). Throws Error
// naming HEADLIGHT_ISA on an unknown name.
void force_isa(std::string_view isa);

// Applies the environment variable HEADLIGHT_ISA (when set) through force_isa; cheap to call on
// every kernel entry (it acts only when the value changes).
void apply_isa_from_environment();

struct PeakMeasurement {
  double gflops = 0;  // the best of the repeats
  int threads = 1;
  int lanes = 1;  // float lanes of the dispatched target
};

// FP32 fused multiply-add peak on ctx.num_threads() threads: independent FMA chains in registers,
// the best of `repeats` runs of about `seconds_per_repeat` each.
PeakMeasurement measure_fma_peak(ThreadContext& ctx, int repeats = 5,
                                 double seconds_per_repeat = 0.05);

struct BandwidthMeasurement {
  double gbytes_per_second = 0;  // the best of the repeats
  size_t bytes = 0;              // buffer size read per repeat
  int threads = 1;
};

// A buffer for repeated read-bandwidth passes: a streaming SIMD sum over `bytes` (much larger
// than the caches), touched once when made. The decode benchmark interleaves its passes with the
// timed runs so that both see the machine in the same state.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(size_t bytes = size_t{512} << 20);
  // One pass on ctx.num_threads() threads; its GB/s.
  double pass(ThreadContext& ctx);
  size_t bytes() const { return buffer_.size() * sizeof(float); }

 private:
  std::vector<float> buffer_;
  std::vector<float> sinks_;  // keeps the sums alive
};

// Memory read bandwidth on ctx.num_threads() threads: ReadBandwidthProbe passes over a `bytes`
// buffer, best of `repeats`.
BandwidthMeasurement measure_read_bandwidth(ThreadContext& ctx, size_t bytes = size_t{512} << 20,
                                            int repeats = 5);

}  // namespace headlight

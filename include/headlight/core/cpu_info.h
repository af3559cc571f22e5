// What this CPU is and what it can do: the SIMD target Highway dispatches to, and the FP32 FMA peak
// measured by a microbenchmark, so that benchmarks report a fraction of the peak of the same run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"

namespace headlight {

struct CpuInfo {
  std::string model_name;                      // from /proc/cpuinfo, or "unknown"
  std::string best_target;                     // the Highway target dynamic dispatch picks
  std::vector<std::string> supported_targets;  // compiled in and supported here, best first
  int hardware_threads = 1;
};

CpuInfo cpu_info();

// Restricts Highway's dynamic dispatch to compiled targets no better than `isa`: "avx3_bf16"
// (AVX-512 with AVX-512 BF16 but not AMX), "avx3", "avx2", "sse4", "scalar", or "" / "best" for
// no restriction. For tests and comparisons; it changes
// Highway's process-wide choice (the one piece of global state, owned by Highway). Throws Error
// naming HEADLIGHT_ISA on an unknown name.
void force_isa(std::string_view isa);

// The Highway targets (HWY_* bits) this CPU supports and force_isa allows. Ask here, not
// hwy::SupportedTargets: in Highway 1.0 that call also points dynamic dispatch back at every
// supported target, undoing force_isa for the rest of the process (tests of the portable paths
// ran the best target instead); this puts the allowed ones back.
int64_t allowed_targets();

// Whether kernels may use instructions beyond Highway's targets: AVX-512 BF16 (false while
// force_isa restricts the targets, except to avx3_bf16), AMX (only without restriction).
// HEADLIGHT_ISA=avx3 is AVX-512 without either.
bool native_bf16_allowed();
bool amx_allowed();

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

// Whether this CPU has a bf16 dot-product instruction that the kernels use (AVX-512 BF16's
// vdpbf16ps: per fp32 lane, acc + a₀·b₀ + a₁·b₁).
bool cpu_has_bf16_dot();

// `iterations` rounds of 20 independent vdpbf16ps chains (64 FLOP each); returns the FLOP count.
// Only on a CPU where cpu_has_bf16_dot().
double bf16_dot_chains(int64_t iterations, float* sink);

// Whether AMX bf16 tiles can be used: the CPU has AMX-BF16, the OS enabled the tile state and
// granted this process its use (asked once, on the first call; see bf16_peak.cc).
bool amx_available();

// Configures this thread's AMX tiles as the kernels use them: palette 1, tiles 0–7 each 16 rows
// of 64 bytes. Every thread that runs tile instructions configures first; release frees the
// state. Only where amx_available().
void amx_configure_tiles();
void amx_release_tiles();

// `iterations` rounds of 4 independent tdpbf16ps (32,768 FLOP each); the FLOP count. Only where
// amx_available().
double amx_tile_chains(int64_t iterations, float* sink);

// Whether decode (a few query rows against a long K/V cache, read once from memory) should
// prefetch its key and value rows into L2 itself, whatever their length: true on Intel cores,
// whose hardware prefetchers left decode at half the read bandwidth (Sapphire Rapids, 32 heads over
// 8, D = 128, 4,096 keys, bf16: 1.28 → 0.96 ms with the prefetches), false elsewhere (AMD Zen 4,
// the same shape: 0.87 → 0.73 ms without them, the misses holding the line fill buffers). A fact
// of the CPU, not state: the vendor from CPUID.
bool decode_prefetches_rows();
// Which bf16 product engine the kernels use: AMX tiles, else vdpbf16ps, else fp32 FMAs on widened
// values ("amx", "avx512_bf16", "fma"), as HEADLIGHT_ISA allows.
const char* bf16_engine();

// The bf16 peak the attention kernels can reach: that of bf16_engine() (measured as
// measure_fma_peak, with amx_tile_chains or bf16_dot_chains, or the FMA peak itself); lanes is the
// multiply-adds per instruction (16,384 for AMX, 32 for vdpbf16ps) or the float lanes.
PeakMeasurement measure_bf16_peak(ThreadContext& ctx, int repeats = 5,
                                  double seconds_per_repeat = 0.05);

struct BandwidthMeasurement {
  double gbytes_per_second = 0;  // the best of the repeats
  size_t bytes = 0;              // buffer size read per repeat
  int threads = 1;
};

// One read-bandwidth pass over memory the caller owns: a streaming SIMD sum of its bytes as
// floats (whole 4 KB pieces; a tail shorter than that is not read), the pieces split among
// ctx.num_threads() threads; the GB/s read. The sums go to `sinks` (one per thread, grown as
// needed) so that the reads are kept.
double read_pass(ThreadContext& ctx, const void* data, size_t bytes, std::vector<float>& sinks);

// One-way latency, in ns, of a cache line handed back and forth `trips` times between two threads
// (workers 0 and 1 of a 2-thread region); 0 when ctx has one thread. On a virtual machine it
// tells where the hypervisor has put the two vCPUs, which sets the memory's read rate there:
// Zen 4 under KVM read 31–36 ns with both on one core complex (sharing its link to memory: the
// read probe 34–36 GB/s) and 110–140 ns on two (58–62 GB/s), changing from second to second
// (docs/notes/2026-12-07-huge-pages-and-decode-rows.md).
double measure_handoff_ns(ThreadContext& ctx, int trips = 2000);

// A buffer for repeated read-bandwidth passes (read_pass over `bytes`, much larger than the
// caches), touched once when made. It is a Tensor, on the pages the kernels' tensors get (2 MiB
// where the system gives them). The decode benchmark interleaves its passes with the timed runs
// so that both see the machine in the same state.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(size_t bytes = size_t{512} << 20);
  // One pass on ctx.num_threads() threads; its GB/s.
  double pass(ThreadContext& ctx);
  size_t bytes() const { return static_cast<size_t>(buffer_.numel()) * sizeof(float); }

 private:
  Tensor buffer_;
  std::vector<float> sinks_;  // keeps the sums alive
};

// Memory read bandwidth on ctx.num_threads() threads: ReadBandwidthProbe passes over a `bytes`
// buffer, best of `repeats`.
BandwidthMeasurement measure_read_bandwidth(ThreadContext& ctx, size_t bytes = size_t{512} << 20,
                                            int repeats = 5);

}  // namespace headlight

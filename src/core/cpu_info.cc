// CPU report and the FMA peak probe, dispatched to the best SIMD target with Highway.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/core/cpu_info.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "src/core/probes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {

double FmaPeakRun(int64_t iterations, float* sink) {
  return FmaChains(iterations, sink);
}
int FmaPeakLanes() {
  return FloatLanes();
}
float StreamSumRun(const float* x, size_t n) {
  return StreamSum(x, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace headlight {

HWY_EXPORT(FmaPeakRun);
HWY_EXPORT(FmaPeakLanes);
HWY_EXPORT(StreamSumRun);

CpuInfo cpu_info() {
  CpuInfo info;
  info.model_name = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) info.model_name = line.substr(colon + 2);
      break;
    }
  }
  const int64_t supported = allowed_targets();
  for (int64_t bits = supported & HWY_TARGETS; bits != 0; bits &= bits - 1) {
    const int64_t target = bits & -bits;
    info.supported_targets.emplace_back(hwy::TargetName(target));
  }
  // Highway numbers better targets with lower bits.
  if (!info.supported_targets.empty()) info.best_target = info.supported_targets.front();
  info.hardware_threads = ThreadContext().num_threads();
  return info;
}

namespace {
// Set with Highway's choice by force_isa (the same process-wide state): the bf16 instructions the
// kernels may use beyond Highway's targets, 2: AMX and AVX-512 BF16, 1: AVX-512 BF16, 0: none.
std::atomic<int> native_bf16{2};
}  // namespace

int64_t allowed_targets() {
  const int64_t targets = hwy::SupportedTargets();  // without the disabled ones
  hwy::GetChosenTarget().Update(targets);           // as HWY_DYNAMIC_DISPATCH's first call would
  return targets;
}

void force_isa(std::string_view isa) {
  int64_t limit = 0;   // the best target allowed; 0: no restriction
  int bf16_level = 0;  // under a restriction: none (native_bf16's levels)
  if (isa == "avx3_bf16") {
    limit = HWY_AVX3;
    bf16_level = 1;  // AVX-512 BF16 without AMX
  } else if (isa == "avx3" || isa == "avx512") {
    limit = HWY_AVX3;
  } else if (isa == "avx2") {
    limit = HWY_AVX2;
  } else if (isa == "sse4") {
    limit = HWY_SSE4;
  } else if (isa == "scalar") {
    limit = HWY_SCALAR;
  } else if (!(isa.empty() || isa == "best")) {
    fail(
        "HEADLIGHT_ISA: unknown instruction set '{}' (expected avx3_bf16, avx3, avx2, sse4, "
        "scalar or best)",
        isa);
  }
  // Highway numbers better targets with lower bits: disable every bit below the limit.
  hwy::DisableTargets(limit == 0 ? 0 : (limit - 1) & ~HWY_SCALAR);
  native_bf16.store(limit == 0 ? 2 : bf16_level);
  // DisableTargets leaves the choice to the next HWY_DYNAMIC_DISPATCH, which makes it through
  // SupportedTargets, and that call points dispatch at every target for a moment before the
  // choice is stored: a second thread dispatching then ran the best target (one in three runs of
  // a two-thread test on the scalar path). Choosing here, on the calling thread, leaves nothing
  // for concurrent first calls to race on.
  allowed_targets();
}

bool native_bf16_allowed() {
  return native_bf16.load() >= 1;
}

bool amx_allowed() {
  return native_bf16.load() >= 2;
}

void apply_isa_from_environment() {
  // The last value applied: HEADLIGHT_ISA and Highway's choice are process-wide by nature.
  static std::mutex mutex;
  static std::string applied;
  const char* env = std::getenv("HEADLIGHT_ISA");
  const std::string value = env ? env : "";
  std::lock_guard<std::mutex> lock(mutex);
  if (value == applied) return;
  force_isa(value);
  applied = value;
}

namespace {

// The best rate of `run` (a loop of independent in-register chains returning its FLOP count) on
// every thread of ctx: the iteration count calibrated on one thread to `seconds_per_repeat`.
double chain_peak(ThreadContext& ctx, int repeats, double seconds_per_repeat,
                  const std::function<double(int64_t, float*)>& run) {
  using Clock = std::chrono::steady_clock;
  float sink = 0;
  int64_t iterations = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    run(iterations, &sink);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > seconds_per_repeat / 4 || iterations > (int64_t{1} << 40)) {
      iterations = static_cast<int64_t>(static_cast<double>(iterations) * seconds_per_repeat /
                                        std::max(s, 1e-9));
      break;
    }
    iterations *= 4;
  }
  double best = 0;
  std::vector<float> sinks(static_cast<size_t>(ctx.num_threads()), 0.0f);
  for (int r = 0; r < std::max(1, repeats); ++r) {
    double flops = 0;
    const auto t0 = Clock::now();
    ctx.parallel_for(ctx.num_threads(), [&](Range range, int worker) {
      double f = 0;
      for (int64_t i = range.begin; i < range.end; ++i)
        f += run(iterations, &sinks[static_cast<size_t>(worker)]);
#pragma omp atomic
      flops += f;
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, flops / s * 1e-9);
  }
  if (sink + sinks[0] == 12345.678f) best += 0;  // keep the sinks alive
  return best;
}

}  // namespace

PeakMeasurement measure_fma_peak(ThreadContext& ctx, int repeats, double seconds_per_repeat) {
  PeakMeasurement result;
  result.threads = ctx.num_threads();
  result.lanes = HWY_DYNAMIC_DISPATCH(FmaPeakLanes)();
  result.gflops = chain_peak(ctx, repeats, seconds_per_repeat, [](int64_t n, float* sink) {
    return HWY_DYNAMIC_DISPATCH(FmaPeakRun)(n, sink);
  });
  return result;
}

const char* bf16_engine() {
  if (!native_bf16_allowed()) return "fma";
  if (amx_allowed() && amx_available()) return "amx";
  return cpu_has_bf16_dot() ? "avx512_bf16" : "fma";
}

bool decode_prefetches_rows() {
#if defined(__x86_64__)
  // Asked once: under a hypervisor CPUID is a trap of a microsecond or more.
  static const bool intel = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    // "GenuineIntel": the vendor string is EBX, EDX, ECX.
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;
  }();
  return intel;
#else
  return false;
#endif
}

PeakMeasurement measure_bf16_peak(ThreadContext& ctx, int repeats, double seconds_per_repeat) {
  const std::string engine = bf16_engine();
  if (engine == "fma") return measure_fma_peak(ctx, repeats, seconds_per_repeat);
  PeakMeasurement result;
  result.threads = ctx.num_threads();
  result.lanes = engine == "amx" ? 16 * 16 * 32 : 32;
  result.gflops = chain_peak(ctx, repeats, seconds_per_repeat,
                             engine == "amx" ? amx_tile_chains : bf16_dot_chains);
  return result;
}

double measure_handoff_ns(ThreadContext& ctx, int trips) {
  if (ctx.num_threads() < 2 || trips <= 0) return 0.0;
  using Clock = std::chrono::steady_clock;
  struct alignas(64) Line {
    std::atomic<int64_t> flag{0};
  };
  Line line;
  double ns = 0.0;
  const auto relax = [] {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_ia32_pause();
#endif
  };
#pragma omp parallel num_threads(2)
  {
    if (omp_get_num_threads() == 2) {  // the same for both, so neither waits alone
      const int w = omp_get_thread_num();
      // Trips [0, warm) untimed: a thread just made or woken takes microseconds to answer.
      const int64_t warm = std::min<int64_t>(trips, 200), total = warm + trips;
      Clock::time_point t0;
      for (int64_t i = 0; i < total; ++i) {
        if (w == 0) {
          if (i == warm) t0 = Clock::now();
          line.flag.store(2 * i + 1, std::memory_order_release);
          while (line.flag.load(std::memory_order_acquire) != 2 * i + 2) relax();
        } else {
          while (line.flag.load(std::memory_order_acquire) != 2 * i + 1) relax();
          line.flag.store(2 * i + 2, std::memory_order_release);
        }
      }
      if (w == 0)
        ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / trips / 2;
    }
  }
  return ns;
}

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes)
    : buffer_(DType::f32,
              {static_cast<int64_t>(std::max<size_t>(bytes / sizeof(float) / 1024, 1) * 1024)}) {
  buffer_.fill(1.0f);
}

double read_pass(ThreadContext& ctx, const void* data, size_t bytes, std::vector<float>& sinks) {
  using Clock = std::chrono::steady_clock;
  constexpr size_t kPiece = 1024;  // floats
  if (sinks.size() < static_cast<size_t>(ctx.num_threads()))
    sinks.resize(static_cast<size_t>(ctx.num_threads()), 0.0f);
  const auto* x = static_cast<const float*>(data);
  const auto pieces = static_cast<int64_t>(bytes / sizeof(float) / kPiece);
  if (pieces == 0) return 0.0;
  const auto t0 = Clock::now();
  ctx.parallel_for(pieces, [&](Range range, int worker) {
    sinks[static_cast<size_t>(worker)] += HWY_DYNAMIC_DISPATCH(StreamSumRun)(
        x + range.begin * kPiece, static_cast<size_t>(range.size()) * kPiece);
  });
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(pieces) * kPiece * sizeof(float) / s * 1e-9;
}

double ReadBandwidthProbe::pass(ThreadContext& ctx) {
  return read_pass(ctx, buffer_.data<std::byte>(), bytes(), sinks_);
}

BandwidthMeasurement measure_read_bandwidth(ThreadContext& ctx, size_t bytes, int repeats) {
  ReadBandwidthProbe probe(bytes);
  BandwidthMeasurement result;
  result.threads = ctx.num_threads();
  result.bytes = probe.bytes();
  for (int r = 0; r < std::max(1, repeats); ++r)
    result.gbytes_per_second = std::max(result.gbytes_per_second, probe.pass(ctx));
  return result;
}

}  // namespace headlight

#endif  // HWY_ONCE

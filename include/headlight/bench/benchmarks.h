// Benchmarks behind `headlight bench …`: each measures the FP32 FMA peak in the same run and
// reports its GFLOP/s (from an explicit FLOP formula) as a fraction of it.
#pragma once

#include <cstdint>
#include <string>

#include "headlight/attention/kv_layout.h"
#include "headlight/core/tensor.h"
#include "headlight/core/timing.h"

namespace headlight::bench {

struct PeakReport {
  double gflops = 0;
  int threads = 1;
  std::string target;  // SIMD target of the probe
};

// The peak of `dtype` on `threads` threads (best of `repeats`): f32, the FMA peak; bf16, the bf16
// dot-product peak (vdpbf16ps) where the kernels use it, else the FMA peak (measure_bf16_peak).
PeakReport measure_peak(int threads, int repeats = 7, DType dtype = DType::f32);

struct MatmulBenchConfig {
  int64_t m = 512, n = 2304, k = 768;  // C[m, n] = A[m, k] · B[k, n]
  bool transpose_b = true;             // B stored [n, k], as a linear layer's weight
  DType dtype = DType::f32;            // of A and B (C is float32): f32 or bf16
  int threads = 2;
  int warmup = 2;
  int runs = 9;
};

struct MatmulBenchReport {
  MatmulBenchConfig config;
  Timing timing;
  double flops = 0;   // 2·m·n·k
  double gflops = 0;  // at the median time
  PeakReport peak;    // of the config's dtype
  double fraction_of_peak = 0;
};

MatmulBenchReport bench_matmul(const MatmulBenchConfig& config);

struct BandwidthReport {
  double gbytes_per_second = 0;
  double bytes = 0;
  int threads = 1;
  // The threads' hand-off latency (measure_handoff_ns) just before the passes: where a
  // hypervisor has put the vCPUs (0 on one thread).
  double handoff_ns = 0;
};

BandwidthReport measure_bandwidth(int threads, int64_t mib = 512);

// What AMX tile operations cost on this core, one thread, ns per operation (medians of
// `repeats`; src/bench/amx_costs.cc has the patterns). available: AMX is there and usable (else
// the rest is zero).
struct AmxCostReport {
  bool available = false;
  double product_ns = 0;                    // one tdpbf16ps, four accumulators in turn
  double load_l1_ns = 0, load_l2_ns = 0;    // one tile load, streaming over 8 KiB / 1 MiB
  double store_l1_ns = 0, store_l2_ns = 0;  // one tile store, the same
  double block_ns = 0;         // a 2 × 2 block's product, its tile loads from L1 included
  double block_stores_ns = 0;  // the same with the block's 4 tile stores
  double vector_ns = 0;        // a softmax row's worth of AVX-512 work (16 vectors)
  // A step of products (4 products, 6 tile loads from L1 / L2), and a row and a step as two loops
  // or interleaved, per pair.
  double step_l1_ns = 0, separate_l1_ns = 0, interleaved_l1_ns = 0;
  double step_l2_ns = 0, separate_l2_ns = 0, interleaved_l2_ns = 0;
  // 72 vector FMAs in 12 chains (registers only), alone and interleaved with 4 products (their
  // operands already in tiles) or with 4 tile loads from L1 / L2, per group.
  double fmas_ns = 0, fmas_products_ns = 0, fmas_loads_l1_ns = 0, fmas_loads_l2_ns = 0;
};

AmxCostReport measure_amx_costs(int repeats = 7);

// fused: the flash kernel; reference: the specification; unfused: the classic path of dense
// products through oneDNN and a softmax over materialised scores (256-row query blocks).
enum class AttentionKernel { fused, reference, unfused };

struct AttentionBenchConfig {
  int64_t batch = 1, heads = 8, kv_heads = 0;  // kv_heads 0: = heads
  int64_t seq = 2048, seq_kv = 0;              // seq_kv 0: = seq
  int64_t head_dim = 64;
  DType dtype = DType::f32;  // of q, k, v and the output: f32 or bf16 (forward only)
  bool causal = false;
  bool backward = false;
  int64_t probs_heads = 0;  // after the forward, recompute the probabilities of this many heads
  // How K and V lie (bf16 forward only): rows, or blocked for decode (attention/kv_layout.h).
  attention::KvLayout kv_layout = attention::KvLayout::rows;
  int threads = 2;
  AttentionKernel kernel = AttentionKernel::fused;
  int warmup = 1;
  int runs = 5;
};

struct AttentionBenchReport {
  AttentionBenchConfig config;  // with the defaults resolved
  Timing timing;
  // Forward: 2·B·H·Lq·Lk·(D + Dv), halved when causal with Lq = Lk; backward: 2.5× the forward.
  double flops = 0;
  double gflops = 0;
  PeakReport peak;  // of the config's dtype
  double fraction_of_peak = 0;
  std::string target;  // SIMD target of the kernel
  // Decode shapes (seq ≤ 16): the key/value bytes read per call against the read bandwidth
  // measured in the same run: the median of read passes interleaved with the timed runs (0
  // otherwise).
  double kv_bytes = 0;
  double kv_gbytes_per_second = 0;
  double bandwidth_gbytes_per_second = 0;
  double fraction_of_bandwidth = 0;
  // The same streaming read over the very K and V copies the runs read (its median, passes
  // interleaved with the runs as the probe's are), and the fraction against it. On a virtual
  // machine a buffer's read rate on 4 KB pages depends on which pages it drew: the probe's own
  // buffer had read 10–32% faster than the copies here; on 2 MiB pages (Tensors from 4 MiB,
  // where Linux gives them) the two read the same (docs/performance.md).
  double kv_read_gbytes_per_second = 0;
  double fraction_of_kv_read = 0;
  // Decode shapes: the threads' hand-off latency (measure_handoff_ns) after each timed run, its
  // median, least and most: on a virtual machine, where the hypervisor kept the vCPUs while the
  // runs and the probe's passes ran (0 on one thread).
  double handoff_ns = 0, handoff_ns_min = 0, handoff_ns_max = 0;
  // Decode shapes: how many copies of K and V the runs rotate over, so that each run reads them
  // from memory (1 otherwise).
  int64_t kv_copies = 1;
  // Memory: bytes of the inputs and outputs, and how far the process's peak resident set grew
  // beyond them while the kernel ran (scratch, packed keys, partial buffers).
  double io_bytes = 0;
  double extra_peak_bytes = 0;
};

AttentionBenchReport bench_attention(const AttentionBenchConfig& config);

// The showcase: exact causal attention over a very long sequence, one head, in bf16, with its
// output checked against the float64 reference on sampled rows.
struct ShowcaseConfig {
  int64_t seq = int64_t{1} << 20;
  int64_t head_dim = 64;
  int64_t sample_rows = 16;  // checked rows: the first, the last, and evenly spaced between
  int threads = 2;
  uint64_t seed = 1;
};

struct ShowcaseReport {
  ShowcaseConfig config;
  double seconds = 0;  // one run (minutes long: one run, not a median)
  double flops = 0;    // 2·N²·D (causal: half of 4·N²·D)
  double gflops = 0;
  PeakReport peak;  // bf16, measured in the same run
  double fraction_of_peak = 0;
  std::string engine;   // the bf16 product engine ("amx", "avx512_bf16", "fma")
  double io_bytes = 0;  // q, k, v and the output
  double extra_peak_bytes = 0;
  double max_error = 0;    // max |kernel − reference| over the sampled rows (bf16 output)
  double error_bound = 0;  // 2⁻⁸·|reference| + 2⁻⁹·max|v| at the worst element
  bool within_bound = false;
};

ShowcaseReport run_showcase(const ShowcaseConfig& config);

}  // namespace headlight::bench

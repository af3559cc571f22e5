// The showcase: exact causal attention over a million tokens (one head, D = 64, bf16) in one call
// of the fused kernel, on the machine's few cores, with memory that stays O(N·D): the kernel never
// holds more than a tile of scores per thread. Its output is checked row by row against the
// float64 reference (attention/reference), which for row i is the non-causal attention of q_i over
// keys 0..i.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/reference.h"
#include "headlight/bench/benchmarks.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/core/tensor.h"
#include "src/bench/resident.h"

namespace headlight::bench {
namespace {

// x [rows, D] bf16, uniform in [−1, 1], filled a chunk at a time.
void fill_bf16(Tensor& x, Generator& g) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<float> buf(static_cast<size_t>(kChunk));
  for (int64_t at = 0; at < x.numel(); at += kChunk) {
    const int64_t n = std::min(kChunk, x.numel() - at);
    g.fill_uniform(buf.data(), n, -1, 1);
    to_bf16(buf.data(), x.data<bf16>() + at, static_cast<size_t>(n));
  }
}

attention::Operand rows_of(Tensor& x, int64_t D, int64_t first_row = 0) {
  return attention::Operand{
      .batch_stride = 0, .head_stride = 0, .row_stride = D, .bf16 = x.data<bf16>() + first_row * D};
}

}  // namespace

ShowcaseReport run_showcase(const ShowcaseConfig& config) {
  const ShowcaseConfig& c = config;
  check(c.seq > 0 && c.head_dim > 0, "showcase: seq and head-dim must be positive");
  check(c.threads > 0, "threads: must be positive, got {}", c.threads);
  check(c.sample_rows >= 1, "sample-rows: must be at least 1, got {}", c.sample_rows);
  const int64_t N = c.seq, D = c.head_dim;
  ShowcaseReport r;
  r.config = c;
  r.peak = measure_peak(c.threads, 7, DType::bf16);
  apply_isa_from_environment();
  r.engine = bf16_engine();

  Tensor q(DType::bf16, {N, D}), k(DType::bf16, {N, D}), v(DType::bf16, {N, D});
  Tensor out(DType::bf16, {N, D});
  Generator g(c.seed);
  for (Tensor* t : {&q, &k, &v}) fill_bf16(*t, g);
  r.io_bytes = 2.0 * 4.0 * static_cast<double>(N * D);

  attention::AttentionParams p;
  p.shape = {.batch = 1,
             .heads = 1,
             .kv_heads = 1,
             .len_q = N,
             .len_kv = N,
             .head_dim = D,
             .value_dim = D};
  p.options.causal = true;
  p.q = rows_of(q, D);
  p.k = rows_of(k, D);
  p.v = rows_of(v, D);
  p.out = rows_of(out, D);
  ThreadContext ctx(c.threads);
  reset_peak_resident();
  const double rss_start = resident_bytes("VmRSS");
  const auto t0 = std::chrono::steady_clock::now();
  attention::cpu::flash_forward(ctx, p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.extra_peak_bytes = std::max(0.0, resident_bytes("VmHWM") - rss_start);
  r.flops = 2.0 * static_cast<double>(N) * static_cast<double>(N) * static_cast<double>(D);
  r.gflops = r.flops / r.seconds * 1e-9;
  r.fraction_of_peak = r.gflops / r.peak.gflops;

  // Sampled rows against the reference: row i attends to keys 0..i.
  float v_max = 0;
  for (int64_t i = 0; i < N * D; ++i)
    v_max = std::max(v_max, std::fabs(to_float(v.data<bf16>()[i])));
  r.within_bound = true;
  std::vector<float> expect(static_cast<size_t>(D));
  for (int64_t s = 0; s < c.sample_rows; ++s) {
    const int64_t i = c.sample_rows == 1 ? N - 1 : s * (N - 1) / (c.sample_rows - 1);
    attention::AttentionParams one;
    one.shape = {.batch = 1,
                 .heads = 1,
                 .kv_heads = 1,
                 .len_q = 1,
                 .len_kv = i + 1,
                 .head_dim = D,
                 .value_dim = D};
    one.q = rows_of(q, D, i);
    one.k = rows_of(k, D);
    one.v = rows_of(v, D);
    one.out = {.data = expect.data(), .batch_stride = 0, .head_stride = 0, .row_stride = D};
    attention::reference::forward(one);
    for (int64_t e = 0; e < D; ++e) {
      const double ref = expect[static_cast<size_t>(e)];
      const double got = to_float(out.data<bf16>()[i * D + e]);
      const double err = std::fabs(got - ref);
      const double bound = std::fabs(ref) * std::ldexp(1.0, -8) + std::ldexp(1.0, -9) * v_max;
      if (err > r.max_error) {
        r.max_error = err;
        r.error_bound = bound;
      }
      if (!(err <= bound)) r.within_bound = false;
    }
  }
  return r;
}

}  // namespace headlight::bench

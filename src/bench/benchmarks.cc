#include "headlight/bench/benchmarks.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "headlight/attention/cpu/flash_backward.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/dispatch.h"
#include "headlight/attention/reference.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/core/tensor.h"
#include "headlight/core/timing.h"
#include "headlight/ops/elementwise.h"
#include "headlight/ops/matmul.h"
#include "src/bench/resident.h"

namespace headlight::bench {
PeakReport measure_peak(int threads, int repeats, DType dtype) {
  check(threads > 0, "threads: must be positive, got {}", threads);
  check(dtype == DType::f32 || dtype == DType::bf16, "dtype: must be f32 or bf16");
  ThreadContext ctx(threads);
  if (dtype == DType::bf16) {
    const PeakMeasurement m = measure_bf16_peak(ctx, repeats);
    const std::string engine = bf16_engine();
    return PeakReport{m.gflops, threads,
                      engine == "amx"           ? "AMX tdpbf16ps"
                      : engine == "avx512_bf16" ? "AVX512_BF16 vdpbf16ps"
                                                : cpu_info().best_target + " FMA (widened)"};
  }
  PeakMeasurement m = measure_fma_peak(ctx, repeats);
  return PeakReport{m.gflops, threads, cpu_info().best_target};
}

BandwidthReport measure_bandwidth(int threads, int64_t mib) {
  check(threads > 0, "threads: must be positive, got {}", threads);
  check(mib > 0 && mib <= (int64_t{1} << 20), "mib: must be in [1, 1048576], got {}", mib);
  ThreadContext ctx(threads);
  const double handoff = measure_handoff_ns(ctx);
  BandwidthMeasurement m = measure_read_bandwidth(ctx, static_cast<size_t>(mib) << 20);
  return BandwidthReport{m.gbytes_per_second, static_cast<double>(m.bytes), threads, handoff};
}

MatmulBenchReport bench_matmul(const MatmulBenchConfig& c) {
  check(c.m > 0 && c.n > 0 && c.k > 0, "matmul bench: m, n, k must be positive, got {}, {}, {}",
        c.m, c.n, c.k);
  check(c.threads > 0, "threads: must be positive, got {}", c.threads);
  MatmulBenchReport r;
  r.config = c;
  ThreadContext ctx(c.threads);
  Generator g(1);
  check(c.dtype == DType::f32 || c.dtype == DType::bf16, "dtype: must be f32 or bf16");
  const bool bf16 = c.dtype == DType::bf16;
  Tensor a = Tensor::empty({c.m, c.k}), b = Tensor::empty({c.k, c.n}),
         out = Tensor::empty({c.m, c.n});
  for (Tensor* t : {&a, &b}) g.fill_uniform(t->data(), t->numel(), -1, 1);
  Tensor a16(DType::bf16, a.shape()), b16(DType::bf16, b.shape());
  if (bf16) {
    to_bf16(a.data(), a16.data<headlight::bf16>(), static_cast<size_t>(a.numel()));
    to_bf16(b.data(), b16.data<headlight::bf16>(), static_cast<size_t>(b.numel()));
  }
  auto arg = [&](const Tensor& f, const Tensor& h, int64_t rows, int64_t cols, int64_t ld,
                 bool transposed) {
    ops::MatrixArg x{.rows = rows, .cols = cols, .ld = ld, .transposed = transposed};
    if (bf16)
      x.bf16 = h.data<headlight::bf16>();
    else
      x.data = f.data();
    return x;
  };
  const ops::MatrixArg am = arg(a, a16, c.m, c.k, c.k, false);
  const ops::MatrixArg bm =
      c.transpose_b ? arg(b, b16, c.k, c.n, c.k, true) : arg(b, b16, c.k, c.n, c.n, false);
  r.peak = measure_peak(c.threads, 7, c.dtype);
  r.timing = time_runs([&] { ops::matmul(ctx, am, bm, {out.data(), c.n}); }, c.warmup, c.runs);
  r.flops = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  r.gflops = r.flops / r.timing.median * 1e-9;
  r.fraction_of_peak = r.gflops / r.peak.gflops;
  return r;
}

namespace {

// The unfused peer: (batch, head) pairs spread over the threads; each runs, per 256-row query
// block, S = scale·Q·Kᵀ (oneDNN, one thread), −inf above the diagonal when causal, the SIMD row
// softmax, and O = S·V (oneDNN).
void unfused_forward(ThreadContext& ctx, const attention::AttentionParams& p) {
  const attention::AttentionShape& s = p.shape;
  const int64_t block = 256, group = s.heads / s.kv_heads;
  const float scale = attention::effective_scale(p);
  ctx.parallel_items(s.batch * s.heads, [&](int64_t item, int worker) {
    const int64_t b = item / s.heads, h = item % s.heads;
    ThreadContext one(1);
    float* scores = ctx.scratch(worker).floats(static_cast<size_t>(block * s.len_kv));
    for (int64_t i0 = 0; i0 < s.len_q; i0 += block) {
      const int64_t rows = std::min(block, s.len_q - i0);
      ops::matmul(one, {p.q.at(b, h, i0), rows, s.head_dim, p.q.row_stride, false},
                  {p.k.at(b, h / group, 0), s.head_dim, s.len_kv, p.k.row_stride, true},
                  {scores, s.len_kv, scale, 0.0f});
      if (p.options.causal)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = i0 + r + 1; j < s.len_kv; ++j)
            scores[r * s.len_kv + j] = -std::numeric_limits<float>::infinity();
      ops::softmax_rows(scores, rows, s.len_kv, s.len_kv);
      ops::matmul(one, {scores, rows, s.len_kv, s.len_kv, false},
                  {p.v.at(b, h / group, 0), s.len_kv, s.value_dim, p.v.row_stride, false},
                  {p.out.at(b, h, i0), p.out.row_stride});
    }
  });
}

// How many copies of `bytes` of keys and values make a working set of at least 256 MiB and four
// times the last-level cache (when the C library reports it).
int64_t kv_copies_beyond_cache(double bytes) {
  double target = 256.0 * (1 << 20);
#ifdef _SC_LEVEL3_CACHE_SIZE
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc > 0) target = std::max(target, 4.0 * static_cast<double>(llc));
#endif
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(target / std::max(bytes, 1.0))));
}

// The config with its defaults resolved, checked (naming the option).
AttentionBenchConfig resolved(const AttentionBenchConfig& config) {
  AttentionBenchConfig c = config;
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.seq_kv == 0) c.seq_kv = c.seq;
  check(c.batch > 0 && c.heads > 0 && c.seq > 0 && c.seq_kv > 0 && c.head_dim > 0,
        "attention bench: batch, heads, seq, seq-kv and head-dim must be positive");
  check(c.threads > 0, "threads: must be positive, got {}", c.threads);
  check(c.kv_heads > 0 && c.heads % c.kv_heads == 0, "kv-heads ({}) must divide heads ({})",
        c.kv_heads, c.heads);
  check(!c.backward || c.kernel != AttentionKernel::unfused,
        "--backward: the unfused path has no backward; use --kernel fused or reference");
  check(c.probs_heads >= 0 && c.probs_heads <= c.heads, "probs-heads: must be in [0, {}], got {}",
        c.heads, c.probs_heads);
  check(c.probs_heads == 0 || (c.kernel == AttentionKernel::fused && !c.backward),
        "probs-heads: only with the fused forward");
  check(c.dtype == DType::f32 || c.dtype == DType::bf16, "dtype: must be f32 or bf16, got {}",
        dtype_name(c.dtype));
  check(c.dtype == DType::f32 || c.kernel != AttentionKernel::unfused,
        "dtype bf16: the fused and reference kernels only (the unfused path is fp32)");
  check(c.kv_layout == attention::KvLayout::rows ||
            (c.dtype == DType::bf16 && !c.backward && c.kernel != AttentionKernel::unfused &&
             c.head_dim % 32 == 0),
        "kv-layout blocked: a bf16 forward (fused or reference) with head-dim a multiple of 32");
  return c;
}

// The operands of one attention call, uniform in [-1, 1], and the params pointing at them.
// Tensors start on a cache line, as PyTorch's do: std::vector's large blocks start 16 bytes past a
// page, which splits every 64-byte load of a row across two lines.
struct AttentionBuffers {
  Tensor q, k, v, out, lse, dq, dk, dv;
  attention::AttentionParams p;

  explicit AttentionBuffers(const AttentionBenchConfig& c) {
    const int64_t B = c.batch, H = c.heads, G = c.kv_heads, L = c.seq, S = c.seq_kv, D = c.head_dim;
    checked_numel({B, H, L, D}, "query");
    checked_numel({B, G, S, D}, "key");
    const bool blocked = c.kv_layout == attention::KvLayout::blocked;
    // A blocked cache: one region of whole chunks per (batch, kv head), filled from rows below.
    const int64_t region = blocked ? attention::blocked_region_elements(S, D) : S * D;
    q = Tensor(c.dtype, {B, H, L, D});
    k = Tensor(c.dtype, {B, G, region / D, D});
    v = Tensor(c.dtype, {B, G, region / D, D});
    out = Tensor(c.dtype, {B, H, L, D});
    lse = Tensor::zeros({B, H, L});
    Generator g(3);
    for (Tensor* t : {&q, &k, &v, &out}) {
      if (c.dtype == DType::f32) {
        g.fill_uniform(t->data(), t->numel(), -1, 1);
        continue;
      }
      std::vector<float> x(static_cast<size_t>(t->numel()));
      g.fill_uniform(x.data(), t->numel(), -1, 1);
      to_bf16(x.data(), t->data<bf16>(), x.size());
      if (blocked && (t == &k || t == &v)) {  // the same values, each key moved to its place
        std::vector<bf16> rows(t->data<bf16>(), t->data<bf16>() + t->numel());
        const auto side = t == &k ? attention::KvSide::keys : attention::KvSide::values;
        for (int64_t bg = 0; bg < B * G; ++bg)
          attention::write_blocked_rows(side, rows.data() + bg * region, D, 0, S, D,
                                        t->data<bf16>() + bg * region);
      }
    }
    p.shape = {.batch = B,
               .heads = H,
               .kv_heads = G,
               .len_q = L,
               .len_kv = S,
               .head_dim = D,
               .value_dim = D};
    p.options.causal = c.causal;
    p.q = operand(q, H * L * D, L * D, D);
    p.k = operand(k, G * region, region, D);
    p.v = operand(v, G * region, region, D);
    p.kv_layout = c.kv_layout;
    p.out = operand(out, H * L * D, L * D, D);
    p.lse = lse.data();
    if (c.backward) {  // gradients in the inputs' dtype, as PyTorch gives them
      dq = Tensor::zeros(c.dtype, q.shape());
      dk = Tensor::zeros(c.dtype, k.shape());
      dv = Tensor::zeros(c.dtype, v.shape());
      p.dout = p.out;
      p.dq = operand(dq, H * L * D, L * D, D);
      p.dk = operand(dk, G * S * D, S * D, D);
      p.dv = operand(dv, G * S * D, S * D, D);
    }
  }
  AttentionBuffers(const AttentionBuffers&) = delete;  // p points into the tensors
  // A float32 or bf16 operand over t with these strides.
  static attention::Operand operand(Tensor& t, int64_t batch_stride, int64_t head_stride,
                                    int64_t row_stride) {
    attention::Operand o{
        .batch_stride = batch_stride, .head_stride = head_stride, .row_stride = row_stride};
    if (t.dtype() == DType::bf16)
      o.bf16 = t.data<bf16>();
    else
      o.data = t.data();
    return o;
  }
  double bytes() const {
    double n = 0;
    for (const Tensor* t : {&q, &k, &v, &out, &lse, &dq, &dk, &dv})
      n += double(t->numel()) * double(dtype_size(t->dtype()));
    return n;
  }
};

// One timed call of the kernel the config names.
std::function<void()> kernel_call(ThreadContext& ctx, const AttentionBenchConfig& c,
                                  attention::AttentionParams& p, Tensor& probs,
                                  const attention::cpu::ProbabilitiesRequest& request) {
  if (c.kernel == AttentionKernel::fused && c.backward) {
    attention::cpu::flash_forward(ctx, p);  // out and lse, as a training step keeps them
    if (c.dtype == DType::bf16)  // AMX where the CPU has it, else the widened fp32 kernel
      return [&] { attention::backward(ctx, p, attention::KernelChoice::fused); };
    return [&] { attention::cpu::flash_backward(ctx, p); };
  }
  if (c.kernel == AttentionKernel::fused)
    return [&] {
      attention::cpu::flash_forward(ctx, p);
      if (c.probs_heads > 0) attention::cpu::probabilities(ctx, p, request, probs.data());
    };
  if (c.kernel == AttentionKernel::unfused) return [&] { unfused_forward(ctx, p); };
  if (c.backward) return [&] { attention::reference::backward(p); };
  return [&] { attention::reference::forward(p); };
}

}  // namespace

AttentionBenchReport bench_attention(const AttentionBenchConfig& config) {
  const AttentionBenchConfig c = resolved(config);
  AttentionBuffers buf(c);
  attention::AttentionParams& p = buf.p;
  const Tensor &k = buf.k, &v = buf.v;
  const int64_t B = c.batch, H = c.heads, G = c.kv_heads, L = c.seq, S = c.seq_kv, D = c.head_dim;
  ThreadContext ctx(c.threads);
  Tensor probs = Tensor::zeros({c.probs_heads, B, L, S});
  attention::cpu::ProbabilitiesRequest request;
  for (int64_t h = 0; h < c.probs_heads; ++h) request.heads.push_back(h);
  std::function<void()> run = kernel_call(ctx, c, p, probs, request);
  AttentionBenchReport r;
  // Decode shapes are memory-bound: a run must read K and V from memory, not from a cache that
  // the previous run filled. They rotate over enough copies that the copies together are well
  // beyond the last-level cache.
  const bool decode = L <= 16 && !c.backward;
  r.kv_copies = decode ? kv_copies_beyond_cache(4.0 * double(k.numel() + v.numel())) : 1;
  Tensor k_pool, v_pool;
  if (r.kv_copies > 1) {
    const int64_t n = k.numel();  // K and V have the same shape
    const auto bytes = static_cast<size_t>(n) * dtype_size(c.dtype);
    k_pool = Tensor(c.dtype, {r.kv_copies, n});
    v_pool = Tensor(c.dtype, {r.kv_copies, n});
    for (int64_t i = 0; i < r.kv_copies; ++i) {
      std::memcpy(k_pool.data<std::byte>() + i * bytes, k.data<std::byte>(), bytes);
      std::memcpy(v_pool.data<std::byte>() + i * bytes, v.data<std::byte>(), bytes);
    }
    int64_t next = 0;
    run = [&, body = run, n, next]() mutable {
      const int64_t at = next++ % r.kv_copies;
      if (c.dtype == DType::bf16) {
        p.k.bf16 = k_pool.data<bf16>() + at * n;
        p.v.bf16 = v_pool.data<bf16>() + at * n;
      } else {
        p.k.data = k_pool.data() + at * n;
        p.v.data = v_pool.data() + at * n;
      }
      body();
    };
  }
  // The peak of the best instruction set, measured before HEADLIGHT_ISA (if set) restricts the
  // kernels, so that a forced lower ISA shows as a lower fraction of this machine's peak.
  r.peak = measure_peak(c.threads, 7, c.dtype);
  apply_isa_from_environment();
  r.config = c;
  r.target = c.kernel == AttentionKernel::fused     ? attention::cpu::flash_target()
             : c.kernel == AttentionKernel::unfused ? "oneDNN + softmax"
                                                    : "scalar reference";
  // Decode: after each timed run a read-bandwidth pass over the probe's buffer, and the same
  // streaming read over the K and V copies the runs read (the whole rotation); the fractions
  // compare the medians. The probe's buffer is made before the resident set is sampled, so it is
  // not counted as the kernel's memory.
  std::unique_ptr<ReadBandwidthProbe> probe;
  std::vector<double> bandwidth, kv_read, handoff;
  std::vector<float> sinks;
  std::function<void()> between;
  if (decode) {
    probe = std::make_unique<ReadBandwidthProbe>();
    const Tensor& ks = r.kv_copies > 1 ? k_pool : k;
    const Tensor& vs = r.kv_copies > 1 ? v_pool : v;
    const auto kb = static_cast<double>(ks.numel()) * double(dtype_size(c.dtype));
    const auto vb = static_cast<double>(vs.numel()) * double(dtype_size(c.dtype));
    between = [&, kb, vb] {
      bandwidth.push_back(probe->pass(ctx));
      const double tk = kb / read_pass(ctx, ks.data<std::byte>(), static_cast<size_t>(kb), sinks);
      const double tv = vb / read_pass(ctx, vs.data<std::byte>(), static_cast<size_t>(vb), sinks);
      kv_read.push_back((kb + vb) / (tk + tv));
      handoff.push_back(measure_handoff_ns(ctx));
    };
  }
  reset_peak_resident();
  const double rss_start = resident_bytes("VmRSS");
  r.timing = time_runs(run, c.warmup, c.runs, between);
  r.extra_peak_bytes = std::max(0.0, resident_bytes("VmHWM") - rss_start);
  r.io_bytes = buf.bytes();
  r.flops = 2.0 * double(B) * double(H) * double(L) * double(S) * double(2 * D);
  if (c.causal && L == S) r.flops /= 2;
  if (c.backward) r.flops *= 2.5;
  r.gflops = r.flops / r.timing.median * 1e-9;
  r.fraction_of_peak = r.gflops / r.peak.gflops;
  if (decode) {
    r.kv_bytes = double(dtype_size(c.dtype)) * double(B) * double(G) * double(S) * double(2 * D);
    r.kv_gbytes_per_second = r.kv_bytes / r.timing.median * 1e-9;
    r.bandwidth_gbytes_per_second = median_of(bandwidth);
    r.fraction_of_bandwidth = r.kv_gbytes_per_second / r.bandwidth_gbytes_per_second;
    r.kv_read_gbytes_per_second = median_of(kv_read);
    r.fraction_of_kv_read = r.kv_gbytes_per_second / r.kv_read_gbytes_per_second;
    if (!handoff.empty()) {
      r.handoff_ns = median_of(handoff);
      r.handoff_ns_min = *std::min_element(handoff.begin(), handoff.end());
      r.handoff_ns_max = *std::max_element(handoff.begin(), handoff.end());
    }
  }
  return r;
}

}  // namespace headlight::bench

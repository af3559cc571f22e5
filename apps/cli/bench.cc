// headlight bench peak | matmul | amx | …: FLOP rates as a fraction of the peak measured in the
// same run, and (amx) what the AMX tile operations cost.

#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/bench/benchmarks.h"
#include "options.h"

namespace headlight::cli {
namespace {

nlohmann::json timing_json(const Timing& t) {
  return {{"seconds_median", t.median},
          {"seconds_min", t.min},
          {"seconds", t.seconds},
          {"other_cores", t.other_cores},
          {"steal_cores", t.steal_cores}};
}

// On stderr (the JSON on stdout stays whole): the runs shared the machine. A process that keeps a
// core busy can halve a 2-thread run whose threads spin between parallel regions.
void warn_if_shared(const Timing& t) {
  if (t.other_cores >= 0.25 || t.steal_cores >= 0.25)
    fmt::print(stderr,
               "warning: during the timed runs other processes kept {:.2f} cores busy and the "
               "hypervisor took {:.2f} (steal): these figures may be low\n",
               t.other_cores, t.steal_cores);
}

}  // namespace

void add_bench_attention(CLI::App& bench);

namespace {

void add_bench_peak(CLI::App& bench) {
  struct PeakArgs {
    int threads = 2;
    int repeats = 7;
    std::string dtype = "f32";
    bool json = false;
  };
  auto peak_args = std::make_shared<PeakArgs>();
  auto* peak =
      bench.add_subcommand("peak", "FP32 FMA peak (GFLOP/s) of an in-register microbenchmark");
  add_threads_option(peak, peak_args->threads, 2);
  positive(peak->add_option("--repeats", peak_args->repeats, "Repeats (the best is reported)")
               ->capture_default_str());
  peak->add_option("--dtype", peak_args->dtype,
                   "f32: the FMA peak; bf16: the bf16 dot-product peak (vdpbf16ps)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  peak->add_flag("--json", peak_args->json, "Machine-readable output");
  peak->callback([peak_args] {
    const bool bf16 = peak_args->dtype == "bf16";
    const bench::PeakReport r = bench::measure_peak(peak_args->threads, peak_args->repeats,
                                                    bf16 ? DType::bf16 : DType::f32);
    if (peak_args->json) {
      fmt::print("{}\n", nlohmann::json{{"peak_gflops", r.gflops},
                                        {"dtype", peak_args->dtype},
                                        {"threads", r.threads},
                                        {"simd_target", r.target}}
                             .dump(2));
    } else {
      fmt::print("{} peak: {:.1f} GFLOP/s on {} thread(s) ({})\n", bf16 ? "bf16 dot" : "FMA",
                 r.gflops, r.threads, r.target);
    }
  });
}

void add_bench_bandwidth(CLI::App& bench) {
  struct BandwidthArgs {
    int threads = 2;
    int64_t mib = 512;
    bool json = false;
  };
  auto bw = std::make_shared<BandwidthArgs>();
  auto* bandwidth = bench.add_subcommand("bandwidth", "Memory read bandwidth (streaming SIMD sum)");
  add_threads_option(bandwidth, bw->threads, 2);
  positive(bandwidth->add_option("--mib", bw->mib, "Buffer size in MiB")->capture_default_str());
  bandwidth->add_flag("--json", bw->json, "Machine-readable output");
  bandwidth->callback([bw] {
    const bench::BandwidthReport r = bench::measure_bandwidth(bw->threads, bw->mib);
    if (bw->json) {
      fmt::print("{}\n", nlohmann::json{{"gbytes_per_second", r.gbytes_per_second},
                                        {"bytes", r.bytes},
                                        {"threads", r.threads},
                                        {"handoff_ns", r.handoff_ns}}
                             .dump(2));
    } else {
      fmt::print("read bandwidth: {:.1f} GB/s on {} thread(s) ({} MiB buffer)\n",
                 r.gbytes_per_second, r.threads, bw->mib);
      if (r.handoff_ns > 0)
        fmt::print("  the threads handed a cache line over in {:.0f} ns just before\n",
                   r.handoff_ns);
    }
  });
}

void add_bench_matmul(CLI::App& bench) {
  auto mm = std::make_shared<bench::MatmulBenchConfig>();
  auto mm_json = std::make_shared<bool>(false);
  auto mm_dtype = std::make_shared<std::string>("f32");
  auto* matmul = bench.add_subcommand(
      "matmul", "oneDNN matrix product C[m,n] = A[m,k]·B[k,n] (B stored [n,k])");
  positive(matmul->add_option("--m", mm->m, "Rows of A and C")->capture_default_str());
  positive(matmul->add_option("--n", mm->n, "Columns of B and C")->capture_default_str());
  positive(matmul->add_option("--k", mm->k, "Inner dimension")->capture_default_str());
  add_threads_option(matmul, mm->threads, mm->threads);
  positive(matmul->add_option("--runs", mm->runs, "Timed runs (the median is reported)")
               ->capture_default_str());
  matmul->add_option("--dtype", *mm_dtype, "f32 | bf16 (A and B; C is float32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  matmul->add_flag("--json", *mm_json, "Machine-readable output");
  matmul->callback([mm, mm_json, mm_dtype] {
    mm->dtype = *mm_dtype == "bf16" ? DType::bf16 : DType::f32;
    const bench::MatmulBenchReport r = bench::bench_matmul(*mm);
    warn_if_shared(r.timing);
    if (*mm_json) {
      nlohmann::json j = timing_json(r.timing);
      j.update({{"m", mm->m},
                {"n", mm->n},
                {"k", mm->k},
                {"threads", mm->threads},
                {"dtype", *mm_dtype},
                {"flops", r.flops},
                {"gflops", r.gflops},
                {"peak_gflops", r.peak.gflops},
                {"fraction_of_peak", r.fraction_of_peak}});
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print(
          "matmul {}x{}x{} {} on {} thread(s): median {:.3f} ms, {:.1f} GFLOP/s = {:.1f}% of the "
          "{} peak {:.1f} GFLOP/s measured in this run\n",
          mm->m, mm->n, mm->k, *mm_dtype, mm->threads, r.timing.median * 1e3, r.gflops,
          100 * r.fraction_of_peak,
          mm->dtype == DType::bf16 ? "bf16 (" + r.peak.target + ")" : "FMA", r.peak.gflops);
    }
  });
}

void add_bench_amx(CLI::App& bench) {
  struct AmxArgs {
    int repeats = 7;
    bool json = false;
  };
  auto args = std::make_shared<AmxArgs>();
  auto* amx = bench.add_subcommand(
      "amx", "What AMX tile operations cost on this core (one thread, ns per operation)");
  positive(amx->add_option("--repeats", args->repeats, "Repeats (the median is reported)")
               ->capture_default_str());
  amx->add_flag("--json", args->json, "Machine-readable output");
  amx->callback([args] {
    const bench::AmxCostReport r = bench::measure_amx_costs(args->repeats);
    struct Row {
      const char *key, *label;
      double ns;
    };
    const std::vector<Row> rows = {
        {"product_ns", "product (tdpbf16ps, 4 accumulators in turn)", r.product_ns},
        {"load_l1_ns", "tile load from L1 (8 KiB stream)", r.load_l1_ns},
        {"load_l2_ns", "tile load from L2 (1 MiB stream)", r.load_l2_ns},
        {"store_l1_ns", "tile store into L1", r.store_l1_ns},
        {"store_l2_ns", "tile store into L2", r.store_l2_ns},
        {"block_ns", "2x2 block, per product (its loads from L1)", r.block_ns},
        {"block_stores_ns", "2x2 block with its 4 stores, per product", r.block_stores_ns},
        {"vector_ns", "vector work: a softmax row's worth (16 vectors)", r.vector_ns},
        {"step_l1_ns", "step: 4 products, 6 tile loads from L1", r.step_l1_ns},
        {"separate_l1_ns", "a row and an L1 step, as two loops", r.separate_l1_ns},
        {"interleaved_l1_ns", "a row and an L1 step, interleaved", r.interleaved_l1_ns},
        {"step_l2_ns", "step: 4 products, 6 tile loads from L2", r.step_l2_ns},
        {"separate_l2_ns", "a row and an L2 step, as two loops", r.separate_l2_ns},
        {"interleaved_l2_ns", "a row and an L2 step, interleaved", r.interleaved_l2_ns},
        {"fmas_ns", "72 FMAs (12 chains, registers only)", r.fmas_ns},
        {"fmas_products_ns", "72 FMAs beside 4 products (operands in tiles)", r.fmas_products_ns},
        {"fmas_loads_l1_ns", "72 FMAs beside 4 tile loads from L1", r.fmas_loads_l1_ns},
        {"fmas_loads_l2_ns", "72 FMAs beside 4 tile loads from L2", r.fmas_loads_l2_ns}};
    if (args->json) {
      nlohmann::json j{{"available", r.available}, {"repeats", args->repeats}};
      for (const Row& row : rows) j[row.key] = row.ns;
      fmt::print("{}\n", j.dump(2));
      return;
    }
    if (!r.available) {
      fmt::print("AMX: not available on this CPU (or not granted by the kernel)\n");
      return;
    }
    fmt::print("AMX tile operations, one thread, medians of {} (ns; x: in products' time)\n",
               args->repeats);
    for (const Row& row : rows)
      fmt::print("  {:<48} {:8.2f} ns  {:5.2f}x\n", row.label, row.ns, row.ns / r.product_ns);
  });
}

// Runs the showcase and prints its report (text or JSON); an Error when the sampled rows are
// outside the reference's bound.
void showcase_command(const bench::ShowcaseConfig& config, bool json) {
  const bench::ShowcaseReport r = bench::run_showcase(config);
  if (json) {
    fmt::print("{}\n", nlohmann::json{{"seq", config.seq},
                                      {"head_dim", config.head_dim},
                                      {"threads", config.threads},
                                      {"dtype", "bf16"},
                                      {"causal", true},
                                      {"engine", r.engine},
                                      {"seconds", r.seconds},
                                      {"flops", r.flops},
                                      {"gflops", r.gflops},
                                      {"peak_gflops", r.peak.gflops},
                                      {"peak_target", r.peak.target},
                                      {"fraction_of_peak", r.fraction_of_peak},
                                      {"io_bytes", r.io_bytes},
                                      {"extra_peak_bytes", r.extra_peak_bytes},
                                      {"sample_rows", config.sample_rows},
                                      {"max_error", r.max_error},
                                      {"error_bound", r.error_bound},
                                      {"within_bound", r.within_bound}}
                           .dump(2));
  } else {
    fmt::print(
        "exact causal attention, {} tokens, one head, D={}, bf16 ({}) on {} thread(s): "
        "{:.1f} s, {:.3g} FLOP at {:.1f} GFLOP/s = {:.1f}% of the bf16 peak {:.1f} GFLOP/s "
        "({}) measured in this run\n"
        "  memory: inputs and output {:.0f} MiB, {:.0f} MiB more at the peak\n"
        "  {} sampled rows against the float64 reference: max error {:.3g} (bound {:.3g}): {}\n",
        config.seq, config.head_dim, r.engine, config.threads, r.seconds, r.flops, r.gflops,
        100 * r.fraction_of_peak, r.peak.gflops, r.peak.target, r.io_bytes / (1 << 20),
        r.extra_peak_bytes / (1 << 20), config.sample_rows, r.max_error, r.error_bound,
        r.within_bound ? "within" : "OUTSIDE the bound");
  }
  if (!r.within_bound)
    throw Error("showcase: the output differs from the reference beyond the bound");
}

}  // namespace

void add_bench_showcase(CLI::App& bench) {
  auto c = std::make_shared<bench::ShowcaseConfig>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = bench.add_subcommand(
      "showcase",
      "Exact causal attention over 1,048,576 tokens (one head, bf16), checked against the "
      "float64 reference on sampled rows");
  positive(cmd->add_option("--seq", c->seq, "Sequence length")->capture_default_str());
  positive(cmd->add_option("--head-dim", c->head_dim, "Head dimension")->capture_default_str());
  positive(cmd->add_option("--sample-rows", c->sample_rows, "Rows checked against the reference")
               ->capture_default_str());
  add_threads_option(cmd, c->threads, c->threads);
  cmd->add_flag("--json", *json, "Machine-readable output");
  cmd->callback([c, json] { showcase_command(*c, *json); });
}

void add_bench(CLI::App& app) {
  auto* bench =
      app.add_subcommand("bench", "Benchmarks, reported as a fraction of this machine's peak");
  // `bench --showcase`: the showcase with its defaults (`bench showcase [options]` for others).
  auto showcase = std::make_shared<bool>(false);
  bench->add_flag("--showcase", *showcase,
                  "Run the showcase with its defaults (the same as `bench showcase`)");
  bench->require_subcommand(0, 1);
  bench->parse_complete_callback([bench, showcase] {
    if (*showcase && !bench->get_subcommands().empty())
      throw CLI::ValidationError("--showcase",
                                 "runs the showcase alone; give a benchmark's options to its "
                                 "subcommand (e.g. `headlight bench showcase --seq 65536`)");
    if (!*showcase && bench->get_subcommands().empty()) throw CLI::RequiredError("A subcommand");
  });
  bench->callback([bench, showcase] {
    if (*showcase && bench->get_subcommands().empty())
      showcase_command(bench::ShowcaseConfig{}, false);
  });
  add_bench_peak(*bench);
  add_bench_attention(*bench);
  add_bench_bandwidth(*bench);
  add_bench_matmul(*bench);
  add_bench_showcase(*bench);
  add_bench_amx(*bench);
}

void add_bench_attention(CLI::App& bench) {
  auto c = std::make_shared<bench::AttentionBenchConfig>();
  auto json = std::make_shared<bool>(false);
  auto kernel = std::make_shared<std::string>("fused");
  auto dtype = std::make_shared<std::string>("f32");
  auto* cmd = bench.add_subcommand("attention", "Attention forward (or backward) GFLOP/s");
  positive(cmd->add_option("--batch", c->batch, "Batch size")->capture_default_str());
  positive(cmd->add_option("--heads", c->heads, "Query heads")->capture_default_str());
  positive(cmd->add_option("--kv-heads", c->kv_heads, "Key/value heads (default: --heads)"));
  positive(cmd->add_option("--seq", c->seq, "Query length")->capture_default_str());
  positive(cmd->add_option("--seq-kv", c->seq_kv, "Key/value length (default: --seq)"));
  positive(cmd->add_option("--head-dim", c->head_dim, "Head dimension")->capture_default_str());
  cmd->add_flag("--causal", c->causal, "Causal mask");
  cmd->add_flag("--backward", c->backward, "Time the backward pass");
  cmd->add_option("--dtype", *dtype,
                  "f32 | bf16 (q, k, v and the output; reported against the bf16 peak)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  at_least(cmd->add_option("--probs-heads", c->probs_heads,
                           "Also recompute the exact probabilities of this many heads "
                           "(need_weights)"),
           0);
  auto layout = std::make_shared<std::string>("rows");
  cmd->add_option("--kv-layout", *layout,
                  "rows | blocked (bf16: the cache laid out for decode, attention/kv_layout.h)")
      ->check(CLI::IsMember({"rows", "blocked"}))
      ->capture_default_str();
  add_threads_option(cmd, c->threads, c->threads);
  cmd->add_option("--kernel", *kernel, "fused | reference | unfused (oneDNN products + softmax)")
      ->check(CLI::IsMember({"fused", "reference", "unfused"}))
      ->capture_default_str();
  positive(cmd->add_option("--runs", c->runs, "Timed runs (the median is reported)")
               ->capture_default_str());
  at_least(cmd->add_option("--warmup", c->warmup, "Untimed runs first")->capture_default_str(), 0);
  cmd->add_flag("--json", *json, "Machine-readable output");
  cmd->callback([c, json, kernel, dtype, layout] {
    c->dtype = *dtype == "bf16" ? DType::bf16 : DType::f32;
    c->kv_layout = *layout == "blocked" ? attention::KvLayout::blocked : attention::KvLayout::rows;
    c->kernel = *kernel == "reference" ? bench::AttentionKernel::reference
                : *kernel == "unfused" ? bench::AttentionKernel::unfused
                                       : bench::AttentionKernel::fused;
    const bench::AttentionBenchReport r = bench::bench_attention(*c);
    warn_if_shared(r.timing);
    const bench::AttentionBenchConfig& k = r.config;
    if (*json) {
      nlohmann::json j = timing_json(r.timing);
      j.update({{"batch", k.batch},
                {"heads", k.heads},
                {"kv_heads", k.kv_heads},
                {"seq", k.seq},
                {"seq_kv", k.seq_kv},
                {"head_dim", k.head_dim},
                {"causal", k.causal},
                {"dtype", *dtype},
                {"backward", k.backward},
                {"probs_heads", k.probs_heads},
                {"kv_layout", *layout},
                {"threads", k.threads},
                {"kernel", *kernel},
                {"target", r.target},
                {"flops", r.flops},
                {"gflops", r.gflops},
                {"peak_gflops", r.peak.gflops},
                {"fraction_of_peak", r.fraction_of_peak}});
      j.update({{"io_bytes", r.io_bytes}, {"extra_peak_bytes", r.extra_peak_bytes}});
      if (r.kv_bytes > 0)
        j.update({{"kv_bytes", r.kv_bytes},
                  {"kv_gbytes_per_second", r.kv_gbytes_per_second},
                  {"bandwidth_gbytes_per_second", r.bandwidth_gbytes_per_second},
                  {"fraction_of_bandwidth", r.fraction_of_bandwidth},
                  {"kv_read_gbytes_per_second", r.kv_read_gbytes_per_second},
                  {"fraction_of_kv_read", r.fraction_of_kv_read},
                  {"kv_copies", r.kv_copies},
                  {"handoff_ns", r.handoff_ns},
                  {"handoff_ns_min", r.handoff_ns_min},
                  {"handoff_ns_max", r.handoff_ns_max}});
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print(
        "attention {} B={} H={} Hkv={} Lq={} Lk={} D={}{} {}{} [{} kernel, {}] on {} thread(s): "
        "median {:.3f} ms, {:.1f} GFLOP/s = {:.1f}% of the {} peak {:.1f} GFLOP/s measured "
        "in this run\n",
        k.backward ? "backward" : "forward", k.batch, k.heads, k.kv_heads, k.seq, k.seq_kv,
        k.head_dim, k.causal ? " causal" : "", *dtype, *layout == "blocked" ? " blocked cache" : "",
        *kernel, r.target, k.threads, r.timing.median * 1e3, r.gflops, 100 * r.fraction_of_peak,
        k.dtype == DType::bf16 ? "bf16 dot" : "FMA", r.peak.gflops);
    if (r.kv_bytes > 0)
      fmt::print(
          "  keys and values read at {:.1f} GB/s = {:.1f}% of the read bandwidth {:.1f} GB/s "
          "(median of passes interleaved with the runs; runs rotate over {} copies of K and V, "
          "{:.0f} MiB, so each reads them from memory); {:.1f}% of the same streaming read over "
          "those copies themselves, {:.1f} GB/s\n",
          r.kv_gbytes_per_second, 100 * r.fraction_of_bandwidth, r.bandwidth_gbytes_per_second,
          r.kv_copies, r.kv_bytes * static_cast<double>(r.kv_copies) / (1 << 20),
          100 * r.fraction_of_kv_read, r.kv_read_gbytes_per_second);
    if (r.kv_bytes > 0 && r.handoff_ns > 0)
      fmt::print(
          "  the threads handed a cache line over in {:.0f} ns (median after each run; "
          "{:.0f}–{:.0f}): "
          "on a virtual machine, tens of ns where the vCPUs share a core complex, hundreds where "
          "they do not\n",
          r.handoff_ns, r.handoff_ns_min, r.handoff_ns_max);
  });
}

}  // namespace headlight::cli

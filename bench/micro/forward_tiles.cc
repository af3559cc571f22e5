// The AMX bf16 forward's inner loop, phase by phase, with the kernel's own tile functions
// (amx::qk_tile, native::softmax_rows, amx::pv_tile): one thread, one item's tile of 128 query
// rows × 256 keys against 8 key blocks of packed K and V (a pair's blocks at N = 2048), as
// accumulate_item runs them (flash_forward.cc). Each benchmark reports its time per 16 scores
// (s_per_16_scores); times the core's clock under AMX, it is the "cycles per 16 scores per core" of
// docs/performance.md (docs/notes/2026-12-06-amx-forward-standin.md: the kernel's phases run as
// fast as this).
//
//   Qk/D       S[128, 256] = Q · Kᵀ for each key block: 2 × 2 blocks of tiles, scores into L2
//   Softmax    the online softmax of S into P (bf16) and the sums of P as rounded, with every
//              row's reference maximum set
//   Pv/D       O[128, D] += P · V for each key block
//   Chain/D    the three in a row for each key block, as the forward runs an item's first block
//              (and tiles with masks)
//   QkExp/D    the scores and their exponentials in one pass (amx::qk_exp_tile), the sums (and
//              those of P as rounded) added
//   FusedChain/D  QkExp then PV, as the forward runs the whole tiles without masks after an
//              item's first
//
// Run: build/release/bench/micro/forward_tiles [--benchmark_filter=Chain] (names Run/Phase/D)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "src/attention/cpu/flash_bf16.h"

namespace {

using headlight::bf16;
namespace kernels = headlight::attention::cpu::kernels;

constexpr size_t kRows = 128, kKeys = 256, kBlocks = 8;
// Kᵀ's, P's and V's rows a cache line longer than their data, as make_plan lays them out on AMX
// (plan.kt_words, ldpb, v_words).
constexpr size_t kKtWords = kKeys + 16, kLdp = kKeys + 32, kVPad = 16;

// A 64-byte aligned buffer of n elements.
template <typename T>
struct Buffer {
  explicit Buffer(size_t n)
      : data(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))) {}
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data;
};

// One item's operands: queries and 8 key blocks as pair words (bf16 pairs about 0.01 and 0.5:
// scores stay small, so the softmax never recomputes a row), scores, probabilities and outputs.
struct Item {
  explicit Item(size_t d)
      : d(d),
        pairs(d / 2),
        q(kRows * pairs),
        kt(kBlocks * pairs * kKtWords),
        v(kBlocks * kKeys / 2 * (d + kVPad)),
        s(kRows * kKeys),
        pb(kRows * kLdp),
        o(kRows * d),
        m(2 * kRows),  // the maxima, then qk_exp_tile's new ones
        l(kRows * 16),
        lr(kRows * 16),
        alpha(kRows) {
    for (size_t i = 0; i < kRows * pairs; ++i)
      q.data[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x7f007fu);
    for (size_t i = 0; i < kBlocks * pairs * kKtWords; ++i)
      kt.data[i] = 0x3c003c00u ^ ((i * 40503u) & 0x7f007fu);
    for (size_t i = 0; i < kBlocks * kKeys / 2 * (d + kVPad); ++i)
      v.data[i] = 0x3f003f00u ^ ((i * 40503u) & 0x7f007fu);
    std::fill(o.data, o.data + kRows * d, 0.0f);
    std::fill(m.data, m.data + kRows, 0.0f);  // every row has its reference maximum
    std::fill(l.data, l.data + kRows * 16, 0.0f);
    std::fill(lr.data, lr.data + kRows * 16, 0.0f);
    std::fill(alpha.data, alpha.data + kRows, 1.0f);
  }
  const uint32_t* k_block(size_t b) const { return kt.data + b * pairs * kKtWords; }
  const uint32_t* v_block(size_t b) const { return v.data + b * kKeys / 2 * (d + kVPad); }
  void qk(size_t b) {
    kernels::amx::qk_tile(q.data, pairs, kRows, k_block(b), kKtWords, pairs, kKeys, 1.0f, s.data,
                          kKeys);
  }
  void softmax() {
    kernels::native::softmax_rows(s.data, kRows, kKeys, kKeys, m.data, l.data, alpha.data, 0.125f,
                                  pb.data, kLdp, nullptr, lr.data);
  }
  void qk_exp(size_t b) {
    kernels::amx::qk_exp_tile(q.data, pairs, kRows, k_block(b), kKtWords, pairs, kKeys, 0.125f,
                              m.data, m.data + kRows, pb.data, kLdp, s.data);
    if (!kernels::native::commit_tile_sums(s.data, m.data + kRows, kRows, m.data, l.data,
                                           alpha.data, pb.data, kLdp, kKeys, lr.data))
      std::abort();
  }
  void pv(size_t b) {
    kernels::amx::pv_tile(pb.data, kLdp, kRows, kKeys / 2, v_block(b), d + kVPad, d, o.data, d,
                          alpha.data);
  }
  size_t d, pairs;
  Buffer<uint32_t> q, kt, v;
  Buffer<float> s;
  Buffer<bf16> pb;
  Buffer<float> o, m, l, lr, alpha;
};

enum class Phase { qk, softmax, pv, chain, qk_exp, fused_chain };

void Run(benchmark::State& state, Phase phase) {
  headlight::apply_isa_from_environment();
  if (!kernels::amx::available()) {
    state.SkipWithError("no AMX tiles on this CPU (or HEADLIGHT_ISA restricts them)");
    return;
  }
  headlight::amx_configure_tiles();
  Item item(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) {
      if (phase == Phase::qk || phase == Phase::chain) item.qk(b);
      if (phase == Phase::softmax || phase == Phase::chain) item.softmax();
      if (phase == Phase::qk_exp || phase == Phase::fused_chain) item.qk_exp(b);
      if (phase == Phase::pv || phase == Phase::chain || phase == Phase::fused_chain) item.pv(b);
    }
    benchmark::DoNotOptimize(item.o.data[0]);
    benchmark::ClobberMemory();
  }
  headlight::amx_release_tiles();
  const double units = static_cast<double>(kBlocks * kRows * kKeys / 16);
  state.counters["s_per_16_scores"] = benchmark::Counter(
      units, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

BENCHMARK_CAPTURE(Run, Qk, Phase::qk)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(Run, Softmax, Phase::softmax)->Arg(64);
BENCHMARK_CAPTURE(Run, Pv, Phase::pv)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(Run, Chain, Phase::chain)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(Run, QkExp, Phase::qk_exp)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(Run, FusedChain, Phase::fused_chain)->Arg(64)->Arg(128);

}  // namespace

BENCHMARK_MAIN();

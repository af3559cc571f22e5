// headlight bench amx: what the AMX tile operations cost on this core, one thread.
//
// The bf16 forward's time on AMX is the sum of its parts
// (docs/notes/2026-12-06-amx-forward-rows.md), and which parts hide behind the products decides its
// design. Each figure is the median over `repeats` of a loop of one pattern, in nanoseconds per
// operation:
//   product          tdpbf16ps, four accumulators in turn (the AMX peak's loop);
//   load / store     a stream of tile loads or stores over 8 KiB (L1) or 1 MiB (L2);
//   block            a 2 × 2 block (4 accumulators, 2 steps of 4 tile loads and 4 products, from
//                    L1), per product, without and with its 4 tile stores at the end;
//   vector / step    a stand-in for a softmax row (16 vectors read, a polynomial each, summed and
//                    written back, in L1) and for a step of products (4 products and 6 tile
//                    loads, from L1 or L2), and both, as two loops and interleaved (a row, then
//                    a step), per pair.
//   FMAs beside      12 chains of 6 FMAs (72 vector FMAs, registers only) alone, then interleaved
//                    with 4 products (operands already in tiles) or with 4 tile loads (L1, L2),
//                    per group: the products run beside the FMAs, the tile loads do not (they
//                    take the vector ports' time, so a phase's tile loads and its vector work add
//                    up even when no product waits; docs/notes/2026-12-06-amx-tile-loads.md).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "headlight/bench/benchmarks.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define HEADLIGHT_AMX_COSTS_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))

namespace headlight::bench {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over `repeats` of ns per operation of fn(), which does `ops` operations.
template <typename Fn>
double median_ns(int repeats, double ops, Fn&& fn) {
  std::vector<double> t;
  fn();  // warm the caches and the tiles
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now();
    fn();
    t.push_back((now() - t0) / ops * 1e9);
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

// 1 KiB tiles in a 64-byte aligned buffer (rows of 64 bytes).
struct Tiles {
  explicit Tiles(size_t bytes)
      : n(bytes / 1024), data(static_cast<char*>(std::aligned_alloc(64, bytes))) {
    std::memset(data, 0, bytes);  // bf16 zeros: the products stay finite
  }
  ~Tiles() { std::free(data); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
  char* at(size_t i) const { return data + (i % n) * 1024; }
  size_t n;
  char* data;
};

constexpr int kReps = 4096;  // iterations of a pattern per timed call

HEADLIGHT_AMX_COSTS_TARGET void products(int iters) {
  for (int i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
}

// Tile T loaded from p, or stored to it (the tile intrinsics take their tile as a literal, hence
// the macro).
#define HEADLIGHT_TILE_IO(kStore, T, p) \
  do {                                  \
    if constexpr (kStore)               \
      _tile_stored(T, (p), 64);         \
    else                                \
      _tile_loadd(T, (p), 64);          \
  } while (false)

// count tile loads (or stores) streaming over t, into (from) tiles 4-7.
template <bool kStore>
HEADLIGHT_AMX_COSTS_TARGET void stream(const Tiles& t, int count) {
  for (int i = 0; i < count; i += 4) {
    HEADLIGHT_TILE_IO(kStore, 4, t.at(i));
    HEADLIGHT_TILE_IO(kStore, 5, t.at(i + 1));
    HEADLIGHT_TILE_IO(kStore, 6, t.at(i + 2));
    HEADLIGHT_TILE_IO(kStore, 7, t.at(i + 3));
  }
}

template <bool kStore>
HEADLIGHT_AMX_COSTS_TARGET void blocks(const Tiles& t, const Tiles& dst, int count) {
  for (int b = 0; b < count; ++b) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < 2; ++k) {
      _tile_loadd(4, t.at(4 * k), 64);
      _tile_loadd(5, t.at(4 * k + 1), 64);
      _tile_loadd(6, t.at(4 * k + 2), 64);
      _tile_loadd(7, t.at(4 * k + 3), 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    if constexpr (kStore) {
      _tile_stored(0, dst.at(0), 64);
      _tile_stored(1, dst.at(1), 64);
      _tile_stored(2, dst.at(2), 64);
      _tile_stored(3, dst.at(3), 64);
    }
  }
}

// A softmax row's worth of vector work: 16 vectors read from `in`, a degree-5 polynomial each
// (five dependent FMAs, four vectors side by side), summed into acc and written to `out`.
HEADLIGHT_AMX_COSTS_TARGET inline void vector_row(const float* in, float* out, __m512* acc) {
  const __m512 c = _mm512_set1_ps(0.5f), d = _mm512_set1_ps(1e-3f);
  for (int k = 0; k < 16; k += 4)
    for (int j = 0; j < 4; ++j) {
      const __m512 x = _mm512_loadu_ps(in + 16 * (k + j));
      __m512 p = _mm512_fmadd_ps(x, c, d);
      for (int e = 0; e < 4; ++e) p = _mm512_fmadd_ps(p, x, d);
      acc[j] = _mm512_add_ps(acc[j], p);
      _mm512_storeu_ps(out + 16 * (k + j), p);
    }
}

// A 1 × 2 step of products: 3 operand tiles loaded twice, 4 products (accumulators 0, 1).
HEADLIGHT_AMX_COSTS_TARGET inline void amx_step(const Tiles& t, int i) {
  _tile_loadd(2, t.at(3 * i), 64);
  _tile_loadd(4, t.at(3 * i + 1), 64);
  _tile_loadd(5, t.at(3 * i + 2), 64);
  _tile_dpbf16ps(0, 2, 4);
  _tile_dpbf16ps(1, 2, 5);
  _tile_loadd(3, t.at(3 * i + 3), 64);
  _tile_loadd(6, t.at(3 * i + 4), 64);
  _tile_loadd(7, t.at(3 * i + 5), 64);
  _tile_dpbf16ps(0, 3, 6);
  _tile_dpbf16ps(1, 3, 7);
}

// mode 0: vector rows only; 1: steps only; 2: the rows, then the steps; 3: interleaved. The rows
// go round a 16 KiB input and output (L1).
HEADLIGHT_AMX_COSTS_TARGET float mixed(const Tiles& t, const Tiles& in, const Tiles& out, int count,
                                       int mode) {
  __m512 acc[4];
  for (auto& a : acc) a = _mm512_setzero_ps();
  auto row = [&](int i) HEADLIGHT_AMX_COSTS_TARGET {
    vector_row(reinterpret_cast<const float*>(in.at(static_cast<size_t>(i))),
               reinterpret_cast<float*>(out.at(static_cast<size_t>(i))), acc);
  };
  if (mode == 0 || mode == 2)
    for (int i = 0; i < count; ++i) row(i);
  if (mode == 1 || mode == 2)
    for (int i = 0; i < count; ++i) amx_step(t, i);
  if (mode == 3)
    for (int i = 0; i < count; ++i) {
      row(i);
      amx_step(t, i);
    }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  alignas(64) float lanes[16];  // (GCC 12's _mm512_reduce_add_ps warns of an undefined operand)
  _mm512_store_ps(lanes, s);
  float sum = 0;
  for (const float x : lanes) sum += x;
  return sum;
}

// mode 0: 72 FMAs a group (12 independent chains of 6); 1: with 4 products a group (tiles 0-3 +=
// 4-7, already loaded); 2: with 4 tile loads from t a group (into tiles 4-7).
HEADLIGHT_AMX_COSTS_TARGET float fmas_beside(const Tiles& t, int count, int mode) {
  __m512 v[12];
  for (int i = 0; i < 12; ++i) v[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
  for (int g = 0; g < count; ++g) {
    if (mode == 1) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else if (mode == 2) {
      _tile_loadd(4, t.at(4 * static_cast<size_t>(g)), 64);
      _tile_loadd(5, t.at(4 * static_cast<size_t>(g) + 1), 64);
      _tile_loadd(6, t.at(4 * static_cast<size_t>(g) + 2), 64);
      _tile_loadd(7, t.at(4 * static_cast<size_t>(g) + 3), 64);
    }
    for (int k = 0; k < 6; ++k)
      for (auto& x : v) x = _mm512_fmadd_ps(x, m, a);
  }
  __m512 s = v[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, v[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  return lanes[0];
}

}  // namespace

AmxCostReport measure_amx_costs(int repeats) {
  check(repeats > 0, "repeats: must be positive, got {}", repeats);
  AmxCostReport r;
  r.available = amx_available();
  if (!r.available) return r;
  amx_configure_tiles();
  const Tiles l1(8 << 10), l2(1 << 20), dst(4 << 10), in(16 << 10), out(16 << 10);
  blocks<false>(l1, dst, 1);  // every tile defined (zeros) before the products read them
  _tile_loadd(4, l1.at(0), 64);
  _tile_loadd(5, l1.at(1), 64);
  _tile_loadd(6, l1.at(2), 64);
  _tile_loadd(7, l1.at(3), 64);
  r.product_ns = median_ns(repeats, 4.0 * kReps, [] { products(kReps); });
  r.load_l1_ns = median_ns(repeats, kReps, [&] { stream<false>(l1, kReps); });
  r.load_l2_ns = median_ns(repeats, kReps, [&] { stream<false>(l2, kReps); });
  r.store_l1_ns = median_ns(repeats, kReps, [&] { stream<true>(l1, kReps); });
  r.store_l2_ns = median_ns(repeats, kReps, [&] { stream<true>(l2, kReps); });
  r.block_ns = median_ns(repeats, 8.0 * kReps, [&] { blocks<false>(l1, dst, kReps); });
  r.block_stores_ns = median_ns(repeats, 8.0 * kReps, [&] { blocks<true>(l1, dst, kReps); });
  volatile float sink = 0;
  auto mixed_ns = [&](const Tiles& t, int mode) {
    return median_ns(repeats, kReps, [&] { sink = sink + mixed(t, in, out, kReps, mode); });
  };
  r.vector_ns = mixed_ns(l1, 0);
  r.step_l1_ns = mixed_ns(l1, 1);
  r.separate_l1_ns = mixed_ns(l1, 2);
  r.interleaved_l1_ns = mixed_ns(l1, 3);
  r.step_l2_ns = mixed_ns(l2, 1);
  r.separate_l2_ns = mixed_ns(l2, 2);
  r.interleaved_l2_ns = mixed_ns(l2, 3);
  auto fmas_ns = [&](const Tiles& t, int mode) {
    return median_ns(repeats, kReps, [&] { sink = sink + fmas_beside(t, kReps, mode); });
  };
  r.fmas_ns = fmas_ns(l1, 0);
  r.fmas_products_ns = fmas_ns(l1, 1);
  r.fmas_loads_l1_ns = fmas_ns(l1, 2);
  r.fmas_loads_l2_ns = fmas_ns(l2, 2);
  amx_release_tiles();
  return r;
}

}  // namespace headlight::bench

#else  // not x86-64: no AMX

namespace headlight::bench {

AmxCostReport measure_amx_costs(int repeats) {
  check(repeats > 0, "repeats: must be positive, got {}", repeats);
  return AmxCostReport{};
}

}  // namespace headlight::bench

#endif

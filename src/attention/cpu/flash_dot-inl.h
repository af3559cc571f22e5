// The decode path's scores (flash_kernels.cc dispatches to them): dot products of a few query rows
// against key rows read where they lie, float32 or bf16, with the prefetches that stream short K
// and V rows from memory. The tile loops of the other paths are in flash_kernels-inl.h.

#if defined(HEADLIGHT_ATTENTION_FLASH_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADLIGHT_ATTENTION_FLASH_DOT_INL_H_
#undef HEADLIGHT_ATTENTION_FLASH_DOT_INL_H_
#else
#define HEADLIGHT_ATTENTION_FLASH_DOT_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "headlight/core/bf16.h"
#include "hwy/highway.h"
#include "src/attention/cpu/flash_kernels-inl.h"
#include "src/attention/cpu/flash_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Prefetches into L2 (locality 2: prefetcht1 on x86).
constexpr int kToL2 = 2;
// Whether decode prefetches its key and value rows (see DotTileT): when there is little
// arithmetic per byte read, a key row of at most kPrefetchRowBytes (two cache lines: bf16 D ≤ 64,
// fp32 D ≤ 32) or one fp32 query row per key, or when the key rows are not contiguous (ldk > dim:
// a position-major cache, whose rows the hardware prefetchers follow poorly); otherwise the rows
// are left to the hardware prefetchers, which follow contiguous rows read in address order
// without holding the core's line fill buffers.
constexpr size_t kPrefetchRowBytes = 128;
template <class T>
constexpr bool PrefetchesDecode(size_t rows, size_t dim, size_t ldk) {
  return dim * sizeof(T) <= kPrefetchRowBytes || (rows == 1 && sizeof(T) == sizeof(float)) ||
         ldk != dim;
}

// Every cache line of `width` elements from `row` into L2.
template <class T>
HWY_INLINE void PrefetchRow(const T* row, size_t width) {
  const auto begin = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63};
  const auto end = reinterpret_cast<uintptr_t>(row + width);
  for (uintptr_t line = begin; line < end; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, kToL2);
}
using attention::cpu::kernels::RowsAhead;

#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
// Sizeless vectors (SVE/RVV) cannot live in arrays and the scalar target has no lane shuffles:
// one dot product at a time, each reduced on its own.
template <class T>
void DotTileT(const float* a, size_t lda, size_t rows, const T* k, size_t ldk, size_t dim,
              size_t cols, float* s, size_t lds, RowsAhead<T> ahead) {
  const DF d;
  const size_t L = hn::Lanes(d);
  for (size_t c = 0; c < cols; ++c)
    for (size_t r = 0; r < rows; ++r) {
      VF acc = hn::Zero(d);
      size_t e = 0;
      for (; e + L <= dim; e += L)
        acc = hn::MulAdd(hn::LoadU(d, a + r * lda + e), LoadKV(d, k + c * ldk + e), acc);
      float x = hn::GetLane(hn::SumOfLanes(d, acc));
      for (; e < dim; ++e) x += a[r * lda + e] * ElementKV(k + c * ldk + e);
      s[r * lds + c] = x;
    }
  (void)ahead;  // no prefetch here
}
#else
// The decode path's scores, straight from key rows where they lie (no packing, each key read
// once): s[r, c] = a[r, :] · k[c·ldk, :].
//
// Memory. Decode streams K and V from memory once; its FMAs take about half as long as the
// reads, so the order of the reads matters more than the FMA count. Each key row is read front
// to back, one key at a time, for a register tile of R query rows (the query heads of a GQA group
// share it): R accumulators, the query vectors reloaded from L1 for every key. A tile of 4 keys ×
// R rows that loads the same vector of 4 key rows at once does a quarter of the query loads but
// interleaves 4 row streams, which the hardware prefetchers follow worse than one (it was
// measured slower; the figures are in docs/notes/2026-12-03-decode.md).
//
// Prefetch. When there is little arithmetic per byte (PrefetchesDecode: short key rows, or one
// fp32 query row), or the rows are not contiguous, the key rows are also prefetched kDotAhead keys
// ahead into L2 (locality 2: prefetcht1 on x86), and so are the rows of `ahead` (decode's value
// rows) as their keys are scored, so that P·V reads them from L2. Otherwise they are not: a
// software prefetch that misses holds one of the core's line fill buffers until its line arrives,
// and with them all waiting the prefetches stall the loads of the arithmetic behind them, while the
// hardware prefetchers, which follow rows read in address order (the keys here, the values in P·V:
// PvInPlaceT reads each value row whole), fetch into L2 without them. On Zen 4, 4,096 keys, 32
// heads over 8, D = 128: bf16 0.87 → 0.73 ms without the prefetches (and P·V by whole rows),
// fp32 1.51 → 1.32; one fp32 row per key (12 heads, D = 64) is the other way, 0.55 ms without and
// 0.46 with (docs/notes/2026-12-05-decode-without-prefetch.md). Intel's cores are the other way
// (RowsAhead::always, from Plan::prefetch_rows): on Sapphire Rapids the same bf16 shape read at
// half the bandwidth without the prefetches, 1.11–1.26 ms against 0.91–0.96 with them, fp32
// 1.61–1.62 against 1.49–1.52 (docs/notes/2026-12-06-intel-decode-prefetch.md).
//
// Reduction. A dot product along the head dim leaves a vector of partial sums per (row, key);
// reducing each one horizontally (log2 L shuffles and adds) costs about as much as its FMAs at
// D = 128. Instead the R accumulators are reduced together, transposed: one step adds the even
// and odd lanes of two vectors into one,
//     fold(v, w) = ConcatEven(w, v) + ConcatOdd(w, v)   (v's pair sums in the lower half, w's in
//                                                        the upper),
// so log2 R steps turn R vectors into one whose segments of L / R lanes sum to the R dot
// products: R − 1 folds instead of R reductions.

// v[0 .. N) → v[0]: N a power of two ≤ L; segment i of v[0] (L / N lanes) sums to Σ v_i.
template <size_t N>
HWY_INLINE void FoldVectors(DF d, VF* v) {
  if constexpr (N > 1) {
    for (size_t i = 0; i < N / 2; ++i)
      v[i] = hn::Add(hn::ConcatEven(d, v[2 * i + 1], v[2 * i]),
                     hn::ConcatOdd(d, v[2 * i + 1], v[2 * i]));
    FoldVectors<N / 2>(d, v);
  }
}

// Query rows of the register tile: 4, or fewer where a vector has fewer lanes.
constexpr size_t kDotRows = HWY_MIN(size_t{4}, hn::MaxLanes(DF()));
constexpr size_t kDotAhead = 32;  // keys (16 KB at D = 128)

// s[r] for rows a[0..R) against one key row k; the head dim is kDim, or dim_any when kDim = 0
// (then a masked last vector). The fixed dims (64, 128) unroll completely. `ahead` (null: none)
// is the key row to prefetch, one cache line per line of k.
template <size_t R, size_t kDim, class T>
HWY_INLINE void DotMicro(const float* HWY_RESTRICT a, size_t lda, const T* HWY_RESTRICT k,
                         size_t dim_any, float* HWY_RESTRICT s, size_t lds, const T* ahead) {
  const DF d;
  constexpr size_t L = hn::MaxLanes(DF());
  constexpr size_t kPadded = R <= 1 ? 1 : R <= 2 ? 2 : 4;
  static_assert(R <= 4 && kPadded <= L, "the register tile must fold into one vector");
  const size_t dim = kDim ? kDim : dim_any, whole = dim / L * L;
  VF acc[kPadded];
  for (size_t i = 0; i < kPadded; ++i) acc[i] = hn::Zero(d);
  for (size_t e = 0; e < whole; e += L) {
    if (ahead && e * sizeof(T) % 64 == 0) __builtin_prefetch(ahead + e, 0, kToL2);  // per line
    const VF kv = LoadKV(d, k + e);
    for (size_t r = 0; r < R; ++r) acc[r] = hn::MulAdd(hn::LoadU(d, a + r * lda + e), kv, acc[r]);
  }
  if (whole < dim) {
    const auto m = hn::FirstN(d, dim - whole);
    const VF kv = LoadKVTail(d, k + whole, dim - whole);
    for (size_t r = 0; r < R; ++r)
      acc[r] = hn::MulAdd(hn::MaskedLoad(m, d, a + r * lda + whole), kv, acc[r]);
  }
  FoldVectors<kPadded>(d, acc);
  HWY_ALIGN float sums[L];
  hn::Store(acc[0], d, sums);
  constexpr size_t seg = L / kPadded;  // lanes per dot product
  for (size_t r = 0; r < R; ++r) {
    float x = sums[r * seg];
    for (size_t t = 1; t < seg; ++t) x += sums[r * seg + t];
    s[r * lds] = x;
  }
}

// One key at a time for a block of R rows, prefetching the key rows kDotAhead keys ahead when
// prefetch_keys is set.
// (ahead: rows to prefetch, one per key; data null for none.)
template <size_t R, size_t kDim, class T>
HWY_INLINE void DotRows(const float* a, size_t lda, const T* k, size_t ldk, size_t dim, size_t cols,
                        float* s, size_t lds, bool prefetch_keys, RowsAhead<T> ahead) {
  for (size_t c = 0; c < cols; ++c) {
    if (ahead.data) PrefetchRow(ahead.data + c * ahead.ld, ahead.width);
    DotMicro<R, kDim>(a, lda, k + c * ldk, dim, s + c, lds,
                      prefetch_keys ? k + (c + kDotAhead) * ldk : nullptr);
  }
}

template <size_t R, class T>
HWY_INLINE void DotRowsAnyDim(const float* a, size_t lda, const T* k, size_t ldk, size_t dim,
                              size_t cols, float* s, size_t lds, bool prefetch_keys,
                              RowsAhead<T> ahead) {
  if (dim == 128)
    DotRows<R, 128>(a, lda, k, ldk, dim, cols, s, lds, prefetch_keys, ahead);
  else if (dim == 64)
    DotRows<R, 64>(a, lda, k, ldk, dim, cols, s, lds, prefetch_keys, ahead);
  else
    DotRows<R, 0>(a, lda, k, ldk, dim, cols, s, lds, prefetch_keys, ahead);
}

// With 32 vector registers (AVX-512) and D = 64 or 128, two query rows stay in registers (16
// at D = 128) over a run of kDotRun keys: each key vector is loaded once for two FMAs and no query
// vector is reloaded (DotMicro loads 5 vectors for 4 FMAs), and four keys × two rows of
// accumulators fold together into eight dot products (one fold per dot product, no scalar
// sums). The next row pair passes over the same run of keys, from L1 (16 KB at D = 128), so the
// keys are still read from memory once, in address order. Without it the scores take as long as
// P·V, half of that in the per-key reductions (docs/notes/2026-12-03-decode.md).
#if HWY_MAX_BYTES == 64
constexpr size_t kDotRun = 32;

// Sums the lanes of each of acc[0..8) (acc[4 · row + key]) into s[key] and s[lds + key]. The
// first two levels add within 128-bit blocks (in-lane interleaves, cheap); the last two add
// halves. Per block after them, P holds the block sums of acc[0..4), Q those of acc[4..8).
HWY_INLINE void StoreEightDots(DF d, const VF* acc, float* HWY_RESTRICT s, size_t lds) {
  const hn::RepartitionToWide<DF> dd;
  VF pair[4];  // per block: [acc[2i], acc[2i+1], acc[2i], acc[2i+1]] partial sums
  for (size_t i = 0; i < 4; ++i)
    pair[i] = hn::Add(hn::InterleaveLower(d, acc[2 * i], acc[2 * i + 1]),
                      hn::InterleaveUpper(d, acc[2 * i], acc[2 * i + 1]));
  auto quad = [&](VF x, VF y) {  // per block: the block sums of x's and y's two vectors each
    const auto wx = hn::BitCast(dd, x), wy = hn::BitCast(dd, y);
    return hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, wx, wy)),
                   hn::BitCast(d, hn::InterleaveUpper(dd, wx, wy)));
  };
  const VF P = quad(pair[0], pair[1]), Q = quad(pair[2], pair[3]);
  // Blocks [P0 + P2, P1 + P3, Q0 + Q2, Q1 + Q3].
  const VF t = hn::Add(hn::ConcatLowerLower(d, Q, P), hn::ConcatUpperUpper(d, Q, P));
  const hn::Half<DF> d8;
  const hn::Half<decltype(d8)> d4;
  const auto lo = hn::LowerHalf(d8, t), hi = hn::UpperHalf(d8, t);
  hn::StoreU(hn::Add(hn::LowerHalf(d4, lo), hn::UpperHalf(d4, lo)), d4, s);
  hn::StoreU(hn::Add(hn::LowerHalf(d4, hi), hn::UpperHalf(d4, hi)), d4, s + lds);
}

template <size_t kNV, class T>
HWY_INLINE void DotPairRun(const float* HWY_RESTRICT a, size_t lda, const T* HWY_RESTRICT k,
                           size_t ldk, size_t cols, float* HWY_RESTRICT s, size_t lds,
                           bool prefetch, RowsAhead<T> ahead) {
  const DF d;
  constexpr size_t L = hn::MaxLanes(DF());
  static_assert(L == 16, "StoreEightDots sums the lanes of 16-lane vectors");
  VF q0[kNV], q1[kNV];
  for (size_t e = 0; e < kNV; ++e) {
    q0[e] = hn::LoadU(d, a + e * L);
    q1[e] = hn::LoadU(d, a + lda + e * L);
  }
  size_t c = 0;
  for (; c + 4 <= cols; c += 4) {
    VF acc[8];  // acc[4 · row + key]
    HWY_UNROLL(8) for (size_t i = 0; i < 8; ++i) acc[i] = hn::Zero(d);
    HWY_UNROLL(4) for (size_t j = 0; j < 4; ++j) {
      const T* key = k + (c + j) * ldk;
      if (ahead.data) PrefetchRow(ahead.data + (c + j) * ahead.ld, ahead.width);
      HWY_UNROLL(8) for (size_t e = 0; e < kNV; ++e) {
        if (prefetch && e * L * sizeof(T) % 64 == 0)  // once per cache line (bf16: every other)
          __builtin_prefetch(key + kDotAhead * ldk + e * L, 0, kToL2);
        const VF kv = LoadKV(d, key + e * L);
        acc[j] = hn::MulAdd(q0[e], kv, acc[j]);
        acc[4 + j] = hn::MulAdd(q1[e], kv, acc[4 + j]);
      }
    }
    StoreEightDots(d, acc, s + c, lds);
  }
  for (; c < cols; ++c) {
    if (ahead.data) PrefetchRow(ahead.data + c * ahead.ld, ahead.width);
    DotMicro<2, kNV * L>(a, lda, k + c * ldk, 0, s + c, lds,
                         prefetch ? k + (c + kDotAhead) * ldk : nullptr);
  }
}

// One query row (a head without others in its group, or a group's odd row) in registers over L keys
// at a time: L accumulators folded together (L − 1 folds) into the L scores, stored as one vector.
// DotMicro<1> summed each key's lanes one by one, a chain of scalar additions per key that took
// more time than its FMAs.
template <size_t kNV, class T>
HWY_INLINE void DotRowRun(const float* HWY_RESTRICT a, const T* HWY_RESTRICT k, size_t ldk,
                          size_t cols, float* HWY_RESTRICT s, bool prefetch, RowsAhead<T> ahead) {
  const DF d;
  constexpr size_t L = hn::MaxLanes(DF());
  VF q[kNV];
  for (size_t e = 0; e < kNV; ++e) q[e] = hn::LoadU(d, a + e * L);
  size_t c = 0;
  for (; c + L <= cols; c += L) {
    VF acc[L];  // acc[key]
    HWY_UNROLL(16) for (size_t j = 0; j < L; ++j) acc[j] = hn::Zero(d);
    HWY_UNROLL(16) for (size_t j = 0; j < L; ++j) {
      const T* key = k + (c + j) * ldk;
      if (ahead.data) PrefetchRow(ahead.data + (c + j) * ahead.ld, ahead.width);
      HWY_UNROLL(8) for (size_t e = 0; e < kNV; ++e) {
        if (prefetch && e * L * sizeof(T) % 64 == 0)
          __builtin_prefetch(key + kDotAhead * ldk + e * L, 0, kToL2);
        acc[j] = hn::MulAdd(q[e], LoadKV(d, key + e * L), acc[j]);
      }
    }
    FoldVectors<L>(d, acc);  // lane j: key c + j's dot product
    hn::StoreU(acc[0], d, s + c);
  }
  for (; c < cols; ++c) {
    if (ahead.data) PrefetchRow(ahead.data + c * ahead.ld, ahead.width);
    DotMicro<1, kNV * L>(a, 0, k + c * ldk, 0, s + c, 0,
                         prefetch ? k + (c + kDotAhead) * ldk : nullptr);
  }
}

template <size_t kNV, class T>
HWY_INLINE void DotTileRegisters(const float* a, size_t lda, size_t rows, const T* k, size_t ldk,
                                 size_t cols, float* s, size_t lds, bool prefetch_keys,
                                 RowsAhead<T> ahead) {
  for (size_t c0 = 0; c0 < cols; c0 += kDotRun) {
    const size_t n = std::min(kDotRun, cols - c0);
    RowsAhead<T> run_ahead = ahead;
    if (ahead.data) run_ahead.data += c0 * ahead.ld;
    size_t r = 0;
    for (; r + 2 <= rows; r += 2)
      DotPairRun<kNV>(a + r * lda, lda, k + c0 * ldk, ldk, n, s + r * lds + c0, lds,
                      r == 0 && prefetch_keys, r == 0 ? run_ahead : RowsAhead<T>{});
    // An odd row after pairs prefetches the keys again: redundant, but it measured 5% faster
    // (9 heads over 3, D = 64, bf16) than without.
    if (r < rows)
      DotRowRun<kNV>(a + r * lda, k + c0 * ldk, ldk, n, s + r * lds + c0, prefetch_keys,
                     r == 0 ? run_ahead : RowsAhead<T>{});
  }
}
#endif  // HWY_MAX_BYTES == 64

template <class T>
void DotTileT(const float* a, size_t lda, size_t rows, const T* k, size_t ldk, size_t dim,
              size_t cols, float* s, size_t lds, RowsAhead<T> ahead) {
  const bool prefetch = ahead.always || PrefetchesDecode<T>(rows, dim, ldk);
  if (!prefetch) ahead = {};
#if HWY_MAX_BYTES == 64
  // One row that prefetches (MHA fp32, or short rows: bound by the reads) goes one key at a time:
  // DotRowRun's bursts of L keys measured 5–9% slower there (12 heads, D = 64, fp32 and bf16),
  // though faster without the prefetches (bf16, D = 128).
  if (rows >= 2 || !prefetch) {
    if (dim == 128) return DotTileRegisters<8>(a, lda, rows, k, ldk, cols, s, lds, prefetch, ahead);
    if (dim == 64) return DotTileRegisters<4>(a, lda, rows, k, ldk, cols, s, lds, prefetch, ahead);
  }
#endif
  // The first block of rows reads the keys from memory and prefetches them and `ahead`.
  size_t r = 0;
  for (; r + kDotRows <= rows; r += kDotRows)
    DotRowsAnyDim<kDotRows>(a + r * lda, lda, k, ldk, dim, cols, s + r * lds, lds,
                            r == 0 && prefetch, r == 0 ? ahead : RowsAhead<T>{});
  for (; r < rows; ++r)
    DotRowsAnyDim<1>(a + r * lda, lda, k, ldk, dim, cols, s + r * lds, lds, r == 0 && prefetch,
                     r == 0 ? ahead : RowsAhead<T>{});
}
#endif

void DotTile(const float* a, size_t lda, size_t rows, const float* k, size_t ldk, size_t dim,
             size_t cols, float* s, size_t lds, RowsAhead<float> ahead) {
  DotTileT(a, lda, rows, k, ldk, dim, cols, s, lds, ahead);
}

// DotTile over bf16 key rows (a bf16 KV cache), widened as they are loaded.
void DotTileBf16(const float* a, size_t lda, size_t rows, const bf16* k, size_t ldk, size_t dim,
                 size_t cols, float* s, size_t lds, RowsAhead<bf16> ahead) {
  DotTileT(a, lda, rows, k, ldk, dim, cols, s, lds, ahead);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle

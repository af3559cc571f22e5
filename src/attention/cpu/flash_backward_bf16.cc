// The backward of bf16 attention: FlashAttention-2's backward (flash_backward.cc has the math)
// with its five tile products in bf16, on AMX tiles where the CPU has them, else on vdpbf16ps
// register tiles (AVX-512 BF16: Zen 4, Cooper Lake); the two engines read the same layouts
// (flash_bf16.h's pair words), so one driver serves both (Engine below). Per (query tile × key
// block):
//     S   = Q·Kᵀ        A = Q pair words [rows, D/2],   B = Kᵀ pair words [D/2, keys]
//     dP' = dO·Vᵀ       A = dO pair words [rows, Dv/2], B = Vᵀ pair words [Dv/2, keys]
//     dVᵀ += dOᵀ·P'     A = dOᵀ bf16 [Dv, rows],        B = P' in row pairs [rows/2, keys]
//     dKᵀ += Qᵀ·dS      A = Qᵀ bf16 [D, rows],          B = dS in row pairs [rows/2, keys]
//     dQ  += dS·K       A = dS bf16 [rows, keys],       B = K in key pairs [keys/2, D]
// The key and value gradients are accumulated transposed ([D, keys]: the query rows are the
// reduction, and the products reduce over pairs of adjacent rows of B), so that no tile of P or dS
// needs transposing; each key block's dKᵀ and dVᵀ are transposed once into the partial buffers.
// P' and dS are rounded to bf16 for the products (the forward rounds P the same way); P itself,
// the softmax gradient, the masks, soft-cap and dropout are the fp32 code of the fp32 backward.
// On AMX a tile without dropout, soft-cap or element masks takes S → P and dP → dS in one pass
// per 2 × 2 block instead (amx::backward_tile, flash_backward_bf16_amx.cc: the same bits), the
// tiles are 128 query rows (64 under a short band) and every leading dim is a cache line longer
// than its data (make_bf16_plan); two such tiles in a row run their dVᵀ and dKᵀ products as one
// (kPairedTiles).
//
// Items and determinism as in flash_backward.cc: (batch, kv head, chunk of query rows), the chunk
// count from L_q alone; every item writes its chunk's slice of fp32 partial dK and dV, added in
// chunk order at the end (then rounded into bf16 gradients, or copied into fp32 ones). With one
// chunk there is nothing to add: the items write dK and dV in place (bf16 ones rounded a key
// block at a time, with the bits the partials' rounding gives). With enough (batch, kv head)
// pairs a thread, an item is a whole pair that runs its chunks in turn and adds their rows in the
// same order (no partials through memory; the same bits). With one chunk and few key blocks an
// item also packs its own keys (into its scratch, kept in L2) rather than reading a packing shared
// by all items.

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "headlight/attention/cpu/flash_backward.h"
#include "headlight/core/bf16.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/tensor.h"
#include "src/attention/cpu/flash_bf16.h"
#include "src/attention/cpu/flash_kernels.h"
#include "src/attention/cpu/flash_tiles.h"

namespace headlight::attention::cpu {
namespace {

constexpr int64_t kMaxChunks = 4;
// Pairs a thread from which an item runs every chunk of its (batch, key/value head) pair (merged,
// in flash_backward_bf16). Binaries alternated, medians of 5, 2 threads, ms: N = 2048, 8 heads,
// D = 64 20.1 → 18.3, D = 128 32.3 → 29.5, causal D = 64 12.0 → 10.9; 4 heads 9.8 → 9.6;
// N = 4096, 8 heads 79.6 → 72.7.
constexpr int64_t kMergedPairsPerThread = 2;
constexpr int64_t kChunkRows = 1024;
// Query rows per tile (a multiple of 32: the row-pair products). On AMX 128: the products into
// dKᵀ and dVᵀ reduce over a tile's rows, so their accumulator tiles are loaded and stored half as
// often. Binaries alternated, medians of 5, ms: N = 2048, 8 heads, D = 64 18.97 → 17.90, D = 128
// 31.1 → 29.4, causal D = 64 11.27 → 10.61, D = 128 19.5 → 18.6; N = 8192, one head, D = 128
// 56.2 → 52.8, causal D = 64 20.0 → 18.9. Except under a band with fewer than kWideTileMinRows
// query rows, where the diagonal tiles' waste weighs more: causal N = 512 1.38 → 1.44 (D = 128)
// and 0.806 → 0.842 (D = 64) with 128.
constexpr int64_t kTileRows = 64, kTileRowsAmx = 128, kWideTileMinRows = 1024;
// On AMX, two adjacent whole tiles of one head that take the one-pass path with the same keys run
// their dVᵀ and dKᵀ products as one (twice the row steps for each load and store of the
// accumulators, which go through L2; the same additions in the same order, so the same bits). A
// stand-in of dKᵀ's product: 24.2 → 19.4 TSC cycles a tile product. Binaries alternated, medians
// of 7, ms: N = 2048, 8 heads, D = 64 12.42 → 12.24, D = 128 21.93 → 21.41; N = 8192, one head
// 26.05 → 25.86; N = 512 within the noise (docs/notes/2026-12-06-amx-operands.md).
constexpr int64_t kPairedTiles = 2;

struct Bf16BackwardPlan {
  int64_t D, Dv, G;
  int64_t p16;        // D's pairs, padded to 16 (Q and Kᵀ pair words)
  int64_t pv16;       // Dv's pairs, padded to 16 (dO and Vᵀ pair words)
  int64_t d16, dv16;  // D and Dv padded to 16 (rows of dKᵀ and dVᵀ, width of dQ and K pairs)
  int64_t bc;         // keys per block, padded to 32
  int64_t br;         // query rows per tile (32 or 64)
  int64_t chunks, chunk_rows, cr;  // query chunks; rows per chunk; padded to whole tiles
  int64_t kv_blocks;
  // Leading dims: lt (words or floats) of Kᵀ, Vᵀ and the [·, bc] tiles (s, pd, dp, aux, pairs,
  // dKᵀ, dVᵀ), lb (bf16) of dS, lk of K's pairs and dQ, lq (bf16) of Qᵀ and dOᵀ: bc, 2·bc, d16 and
  // cr, a cache line more on AMX.
  int64_t lt, lb, lk, lq;
  int64_t block_words;  // packed key block: Kᵀ [p16, lt], Vᵀ [pv16, lt], K pairs [bc/2, lk]
};

Bf16BackwardPlan make_bf16_plan(const AttentionParams& p, bool amx) {
  const AttentionShape& sh = p.shape;
  Bf16BackwardPlan a;
  a.D = sh.head_dim, a.Dv = sh.value_dim, a.G = sh.heads / sh.kv_heads;
  a.p16 = round_up(std::max<int64_t>((a.D + 1) / 2, 1), 16);
  a.pv16 = round_up(std::max<int64_t>((a.Dv + 1) / 2, 1), 16);
  a.d16 = round_up(std::max<int64_t>(a.D, 1), 16);
  a.dv16 = round_up(std::max<int64_t>(a.Dv, 1), 16);
  a.bc = round_up(std::min(kBlockKeys, std::max<int64_t>(sh.len_kv, 1)), 32);
  const bool wide = amx && !(banded(p.options) && sh.len_q < kWideTileMinRows);
  a.br = std::min<int64_t>(wide ? kTileRowsAmx : kTileRows,
                           round_up(std::max<int64_t>(sh.len_q, 1), 32));
  a.chunks = std::clamp<int64_t>((sh.len_q + kChunkRows - 1) / kChunkRows, 1, kMaxChunks);
  a.chunk_rows = (sh.len_q + a.chunks - 1) / a.chunks;
  a.cr = round_up(std::max<int64_t>(a.chunk_rows, 1), a.br);
  a.kv_blocks = (sh.len_kv + kBlockKeys - 1) / kBlockKeys;
  // On AMX every leading dim is a cache line (16 words) longer than its data: rows 512 bytes to 2
  // KiB apart had put a tile's 16 rows into 2 to 8 of L1's 64 sets, the tiles of one product
  // crowding each other out. Binaries alternated, medians of 5, ms: N = 2048, 8 heads, D = 64
  // 20.6 → 19.5, D = 128 34.9 → 30.7, causal D = 64 12.2 → 11.5. (vdpbf16ps, with its register
  // tiles, gains nothing: not padded there.)
  const int64_t pad = amx ? 16 : 0;
  a.lt = a.bc + pad, a.lb = a.bc + 2 * pad, a.lk = a.d16 + pad, a.lq = a.cr + 2 * pad;
  a.block_words = a.p16 * a.lt + a.pv16 * a.lt + a.bc / 2 * a.lk;
  return a;
}

// One worker's scratch (sizes in elements of their types).
struct Bf16Scratch {
  uint32_t* qp;        // [G, cr, p16] query pair words
  bf16* qt;            // [G, d16, cr] queries transposed (leading dim lq)
  uint32_t* dop;       // [G, cr, pv16] output-gradient pair words
  bf16* dot;           // [G, dv16, cr] output gradients transposed (leading dim lq)
  float* dq;           // [G, cr, d16] dQ / scale (leading dim lk)
  float* dkt;          // [d16, bc] dKᵀ / scale of the current key block (leading dim lt)
  float* dvt;          // [dv16, bc] dVᵀ (lt)
  float* s;            // [br, bc] scores, then P (lt, as the next four)
  float* pd;           // [br, bc] P after dropout
  float* dp;           // [br, bc] dP, then dS
  float* aux;          // [br, bc] soft-cap derivatives
  uint32_t* pairs;     // [kPairedTiles · br / 2, bc] P' or dS in row pairs (leading dim lt)
  uint32_t* ds_pairs;  // [kPairedTiles · br / 2, bc] dS in row pairs beside P's (backward_tile)
  bf16* ds;            // [br, bc] dS rounded (leading dim lb)
  int32_t* limits;     // [br] the rows' key limits of a structurally masked tile (row_limits)
  float* key_rows;     // [bc, max(D, Dv)] a key block's dK or dV rows before rounding (KeyRows::to)
  float* row_scale;    // [bc] the factor of each of those rows
};

size_t scratch_bytes(const Bf16BackwardPlan& a) {
  const int64_t G = a.G, cr = a.cr, bc = a.bc, br = a.br, lt = a.lt;
  const int64_t words = G * cr * a.p16 + G * cr * a.pv16 + 2 * (kPairedTiles * br / 2 * lt);
  const int64_t halves = G * a.d16 * a.lq + G * a.dv16 * a.lq + br * a.lb;
  const int64_t floats =
      G * cr * a.lk + a.d16 * lt + a.dv16 * lt + 4 * br * lt + bc * std::max(a.D, a.Dv) + bc;
  return static_cast<size_t>(4 * words + 2 * halves + 4 * floats + 4 * br + 64 * 18);
}

Bf16Scratch carve(void* base, const Bf16BackwardPlan& a) {
  auto* at = static_cast<char*>(base);
  auto take = [&](int64_t bytes) {
    char* here = at;
    at += round_up(bytes, 64);
    return here;
  };
  const int64_t G = a.G, cr = a.cr, bc = a.bc, br = a.br, lt = a.lt;
  Bf16Scratch w;
  w.qp = reinterpret_cast<uint32_t*>(take(4 * G * cr * a.p16));
  w.qt = reinterpret_cast<bf16*>(take(2 * G * a.d16 * a.lq));
  w.dop = reinterpret_cast<uint32_t*>(take(4 * G * cr * a.pv16));
  w.dot = reinterpret_cast<bf16*>(take(2 * G * a.dv16 * a.lq));
  w.dq = reinterpret_cast<float*>(take(4 * G * cr * a.lk));
  w.dkt = reinterpret_cast<float*>(take(4 * a.d16 * lt));
  w.dvt = reinterpret_cast<float*>(take(4 * a.dv16 * lt));
  w.s = reinterpret_cast<float*>(take(4 * br * lt));
  w.pd = reinterpret_cast<float*>(take(4 * br * lt));
  w.dp = reinterpret_cast<float*>(take(4 * br * lt));
  w.aux = reinterpret_cast<float*>(take(4 * br * lt));
  w.pairs = reinterpret_cast<uint32_t*>(take(4 * kPairedTiles * br / 2 * lt));
  w.ds_pairs = reinterpret_cast<uint32_t*>(take(4 * kPairedTiles * br / 2 * lt));
  w.ds = reinterpret_cast<bf16*>(take(2 * br * a.lb));
  w.limits = reinterpret_cast<int32_t*>(take(4 * br));
  w.key_rows = reinterpret_cast<float*>(take(4 * bc * std::max(a.D, a.Dv)));
  w.row_scale = reinterpret_cast<float*>(take(4 * bc));
  return w;
}

// Rows r0 .. r0 + rows of x (b, h), `width` wide, as bf16 (rounded when x is fp32): into pair words
// dst [rows, pairs] (zero past width) and transposed into dst_t [width_pad, ld_t] (columns from
// c0; the caller zeroes what lies beyond). Each row goes straight into its pair words (copied, or
// rounded by one to_bf16 call); then two rows' elements side by side, w[e] = row_r[e] |
// row_{r+1}[e] << 16, are the 32-bit word of dst_t's columns (r, r + 1) in its row e: the rows go
// in pairs through the word transpose (kernels::transpose_words), 16 pairs at a time, when dst_t's
// rows are whole words (an odd last row, or odd rows of dst_t, one element at a time). Per-row
// copies through a buffer had been 8% of a bf16 backward at the GPT engine's shape.
void pack_item_rows(const Operand& x, int64_t b, int64_t h, int64_t r0, int64_t rows, int64_t width,
                    int64_t pairs, uint32_t* dst, bf16* dst_t, int64_t ld_t) {
  constexpr int64_t kPairs = 16;
  auto row_of = [&](int64_t r) { return reinterpret_cast<bf16*>(dst + r * pairs); };
  const bool word_rows = x.bf16 && width % 2 == 0 && x.row_stride % 2 == 0 &&
                         x.head_stride % 2 == 0 && x.batch_stride % 2 == 0 &&
                         reinterpret_cast<uintptr_t>(x.bf16) % 4 == 0;
  for (int64_t r = 0; r < rows; ++r) {
    bf16* d = row_of(r);
    if (word_rows) {  // whole words: copied as words
      const auto* src = reinterpret_cast<const uint32_t*>(x.bf16_at(b, h, r0 + r));
      for (int64_t e = 0; e < width / 2; ++e) dst[r * pairs + e] = src[e];
    } else if (x.bf16) {
      std::copy_n(x.bf16_at(b, h, r0 + r), width, d);
    } else {
      to_bf16(x.at(b, h, r0 + r), d, static_cast<size_t>(width));
    }
    std::fill(d + width, d + 2 * pairs, bf16{});
  }
  const bool words_ok = ld_t % 2 == 0 && reinterpret_cast<uintptr_t>(dst_t) % 4 == 0;
  std::vector<uint32_t> words(words_ok ? static_cast<size_t>(kPairs * width) : 0);
  for (int64_t c = 0; c < rows; c += 2 * kPairs) {
    const int64_t n = std::min(2 * kPairs, rows - c), whole = words_ok ? n / 2 : 0;
    for (int64_t k = 0; k < whole; ++k) {
      const uint16_t* lo = &row_of(c + 2 * k)->bits;
      const uint16_t* hi = &row_of(c + 2 * k + 1)->bits;
      kernels::pair_rows(lo, hi, static_cast<size_t>(width), words.data() + k * width);
    }
    if (whole > 0)
      kernels::transpose_words(words.data(), static_cast<size_t>(width), static_cast<size_t>(whole),
                               static_cast<size_t>(width),
                               reinterpret_cast<uint32_t*>(dst_t) + c / 2,
                               static_cast<size_t>(ld_t / 2));
    for (int64_t r = c + 2 * whole; r < c + n; ++r) {  // an odd last row, or rows not in words
      const bf16* src = row_of(r);
      for (int64_t e = 0; e < width; ++e) dst_t[e * ld_t + r] = src[e];
    }
  }
}

struct Item {
  int64_t b, g, c, row_begin, row_end;
};

// Where an item writes its dK or dV rows: fp32 rows at data (ld apart), a chunk's partial
// [len_kv, width] (ld = width) or, with one chunk and fp32 gradients, the gradient itself (ld its
// row stride); or, with one chunk and bf16 gradients, the rows of (b, g) of the bf16 operand `to`,
// rounded from the scratch's key_rows a key block at a time (as add_partials would have rounded
// the partial: the same bits, without the partial's pass over memory). With `add` (an item that
// runs every chunk of its pair, after the first chunk), fp32 rows at data already hold the earlier
// chunks' sum and each key block's rows are added to them, as add_partials adds the partials.
struct KeyRows {
  float* data = nullptr;
  int64_t ld = 0;
  const Operand* to = nullptr;
  int64_t b = 0, g = 0;
  bool add = false;

  // Rows [j0, j0 + n) of `width` zeros (added, with `add`: -0 + 0 is +0, as in add_partials).
  void zero(int64_t j0, int64_t n, int64_t width) const {
    for (int64_t j = j0; j < j0 + n; ++j)
      if (to)
        std::fill_n(to->bf16_at(b, g, j), width, bf16{});
      else if (add)
        for (int64_t e = 0; e < width; ++e) data[j * ld + e] += 0.0f;
      else
        std::fill_n(data + j * ld, width, 0.0f);
  }

  // Rows [j0, j0 + n) of src [n, width] (ld lds) stored, or added with `add`.
  void put(int64_t j0, int64_t n, int64_t width, const float* src, int64_t lds) const {
    for (int64_t j = 0; j < n; ++j) {
      float* dst = data + (j0 + j) * ld;
      const float* row = src + j * lds;
      if (add)
        for (int64_t e = 0; e < width; ++e) dst[e] += row[e];
      else
        std::copy_n(row, width, dst);
    }
  }
};

// dst row r = to_bf16(src row r · scale[r]) for r < rows, `width` elements (to_bf16's bits).
void round_rows(const float* src, int64_t lds, int64_t rows, int64_t width, const float* scale,
                bf16* dst, int64_t ldd) {
  if (kernels::bf16_native())
    return kernels::native::scale_round_rows(src, static_cast<size_t>(lds),
                                             static_cast<size_t>(rows), static_cast<size_t>(width),
                                             scale, dst, static_cast<size_t>(ldd));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < width; ++e) dst[r * ldd + e] = to_bf16(src[r * lds + e] * scale[r]);
}

// The tile products on one of the two engines, in the same layouts.
struct Engine {
  bool amx;  // AMX tiles (the thread configures its tiles per item), else vdpbf16ps

  // c[rows, cols] = scale · a · b: a pair words [rows, pairs] (lda words), b pair words
  // [pairs, ldb]; rows a multiple of 16.
  void scores(const uint32_t* a, size_t lda, size_t rows, const uint32_t* b, size_t ldb,
              size_t pairs, size_t cols, float scale, float* c, size_t ldc) const {
    if (amx)
      kernels::amx::qk_tile(a, lda, rows, b, ldb, pairs, cols, scale, c, ldc);
    else
      kernels::native::qk_tile_bf16(a, lda, rows, b, ldb, pairs, cols, scale, c, ldc);
  }

  // c[rows, cols] += a · b: a bf16 rows [rows, 32·steps] (lda elements, even), b pair words
  // [16·steps, ldb]; rows and cols multiples of 16.
  void accumulate(const bf16* a, size_t lda, size_t rows, const uint32_t* b, size_t ldb,
                  size_t steps, size_t cols, float* c, size_t ldc) const {
    if (amx)
      kernels::amx::product(a, lda, rows, b, ldb, steps, cols, c, ldc, /*accumulate=*/true);
    else  // a's rows as pair words: two adjacent elements of the reduction per word
      kernels::native::pv_tile_bf16(reinterpret_cast<const uint32_t*>(a), lda / 2, rows, 16 * steps,
                                    b, ldb, cols, c, ldc, /*alpha=*/nullptr);
  }
};

void run_item(const AttentionParams& p, const Bf16BackwardPlan& a, const Engine& engine,
              const Bf16Scratch& w, const uint32_t* blocks, const float* dots,
              const KeyRows& dk_out, const KeyRows& dv_out, const Item& it) {
  const AttentionShape& sh = p.shape;
  const AttentionOptions& o = p.options;
  const int64_t G = a.G, D = a.D, Dv = a.Dv, bc = a.bc, br = a.br, cr = a.cr;
  const int64_t lt = a.lt, lb = a.lb, lk = a.lk, lq = a.lq;
  const int64_t rows_total = it.row_end - it.row_begin;
  const float scale = effective_scale(p);
  if (engine.amx) amx_configure_tiles();

  std::fill(w.dq, w.dq + G * cr * lk, 0.0f);
  // pack_item_rows writes rows [0, rows_total) of the pair words and columns [0, rows_total) of
  // the transposes' first `width` rows: zero the rest (the padding the products read).
  auto zero_padding = [&](uint32_t* pairs_at, int64_t pairs, bf16* t_at, int64_t width,
                          int64_t height) {
    std::fill(pairs_at + rows_total * pairs, pairs_at + cr * pairs, 0u);
    for (int64_t e = 0; e < width; ++e)
      std::fill(t_at + e * lq + rows_total, t_at + e * lq + cr, bf16{});
    for (int64_t e = width; e < height; ++e) std::fill(t_at + e * lq, t_at + e * lq + cr, bf16{});
  };
  for (int64_t hg = 0; hg < G; ++hg) {
    const int64_t h = it.g * G + hg;
    uint32_t *qp = w.qp + hg * cr * a.p16, *dop = w.dop + hg * cr * a.pv16;
    bf16 *qt = w.qt + hg * a.d16 * lq, *dot = w.dot + hg * a.dv16 * lq;
    pack_item_rows(p.q, it.b, h, it.row_begin, rows_total, D, a.p16, qp, qt, lq);
    pack_item_rows(p.dout, it.b, h, it.row_begin, rows_total, Dv, a.pv16, dop, dot, lq);
    zero_padding(qp, a.p16, qt, D, a.d16);
    zero_padding(dop, a.pv16, dot, Dv, a.dv16);
  }

  const auto [j_begin, j_end] = rows_key_span(p, it.b, it.row_begin, it.row_end);
  for (int64_t blk = 0; blk < a.kv_blocks; ++blk) {
    const int64_t j0 = blk * kBlockKeys, cols = std::min(kBlockKeys, sh.len_kv - j0);
    if (j0 + cols <= j_begin || j0 >= j_end) {  // no row of the chunk sees this block
      dk_out.zero(j0, cols, D);
      dv_out.zero(j0, cols, Dv);
      continue;
    }
    const uint32_t* kt = blocks + blk * a.block_words;
    const uint32_t* vt = kt + a.p16 * lt;
    const uint32_t* kp = vt + a.pv16 * lt;
    std::fill(w.dkt, w.dkt + a.d16 * lt, 0.0f);
    std::fill(w.dvt, w.dvt + a.dv16 * lt, 0.0f);
    for (int64_t hg = 0; hg < G; ++hg) {
      const int64_t h = it.g * G + hg;
      // A one-pass tile whose dVᵀ and dKᵀ products wait for the next tile's (kPairedTiles): its
      // row offset in the chunk and its padded keys; its pairs lie first in w.pairs/w.ds_pairs.
      int64_t pending_at = -1, pending_cols = 0;
      // dVᵀ += dOᵀ · P', dKᵀ += Qᵀ · dS over `r32` rows from row offset `from` (their pairs at the
      // start of w.pairs and w.ds_pairs).
      auto transposed_products = [&](int64_t from, int64_t r32, int64_t cols_pad) {
        engine.accumulate(w.dot + hg * a.dv16 * lq + from, static_cast<size_t>(lq),
                          static_cast<size_t>(a.dv16), w.pairs, static_cast<size_t>(lt),
                          static_cast<size_t>(r32 / 32), static_cast<size_t>(cols_pad), w.dvt,
                          static_cast<size_t>(lt));
        engine.accumulate(w.qt + hg * a.d16 * lq + from, static_cast<size_t>(lq),
                          static_cast<size_t>(a.d16), w.ds_pairs, static_cast<size_t>(lt),
                          static_cast<size_t>(r32 / 32), static_cast<size_t>(cols_pad), w.dkt,
                          static_cast<size_t>(lt));
      };
      auto flush = [&] {
        if (pending_at >= 0) transposed_products(pending_at, br, pending_cols);
        pending_at = -1;
      };
      for (int64_t i0 = it.row_begin; i0 < it.row_end; i0 += br) {
        const int64_t rows = std::min(br, it.row_end - i0), r16 = round_up(rows, 16);
        const int64_t r32 = round_up(rows, 32), at = i0 - it.row_begin;
        const KeyRange lo_row = key_range(p, it.b, i0), hi_row = key_range(p, it.b, i0 + rows - 1);
        if (hi_row.hi < j0 || lo_row.lo > j0 + cols - 1) continue;
        const int64_t tcols = std::min(cols, hi_row.hi + 1 - j0);
        const int64_t cols_pad = round_up(tcols, 16), cols32 = round_up(cols_pad, 32);
        const TilePos tile{
            it.b, h, i0, rows, j0, tcols, !(hi_row.lo <= j0 && lo_row.hi >= j0 + tcols - 1)};
        // grad_t [height, keys] += xt [height, rows] · x [rows, keys]: x (P' or dS) rounded into
        // row pairs, xt this tile's columns of the transposed rows (dOᵀ or Qᵀ, bf16).
        auto accumulate_transposed = [&](const float* x, const bf16* xt, int64_t height,
                                         float* grad_t) {
          kernels::native::row_pairs(x, static_cast<size_t>(lt), static_cast<size_t>(rows),
                                     static_cast<size_t>(r32), static_cast<size_t>(cols_pad),
                                     w.pairs, static_cast<size_t>(lt));
          engine.accumulate(xt, static_cast<size_t>(lq), static_cast<size_t>(height), w.pairs,
                            static_cast<size_t>(lt), static_cast<size_t>(r32 / 32),
                            static_cast<size_t>(cols_pad), grad_t, static_cast<size_t>(lt));
        };
        const float* lse = p.lse + (it.b * sh.heads + h) * sh.len_q + i0;
        const float* dot_rows = dots + (it.b * sh.heads + h) * sh.len_q + i0;
        // On a diagonal tile (vdpbf16ps; AMX takes whole 16-row tiles) S, dP' and dQ are computed
        // per block of kDiagonalRows rows only up to the block's last row's last key: S past it
        // is −inf and dP' 0 (written), so P, dS and their products are 0 there, as computed.
        const int64_t first = engine.amx ? tcols : first_row_columns(p, tile);
        // out[rows, cols_pad] = scale · x · b (pair words), by blocks on a diagonal; `fill` past
        // each block's keys.
        auto scores = [&](const uint32_t* x, int64_t ldx, const uint32_t* b, int64_t pairs,
                          float sc, float* out, float fill) {
          if (first >= tcols)
            return engine.scores(x, static_cast<size_t>(ldx), static_cast<size_t>(r16), b,
                                 static_cast<size_t>(lt), static_cast<size_t>(pairs),
                                 static_cast<size_t>(cols_pad), sc, out, static_cast<size_t>(lt));
          for_diagonal_blocks(rows, tcols, first, [&](int64_t r0, int64_t n, int64_t keys) {
            const int64_t need = std::min(cols_pad, round_up(keys, 16));
            if (need > 0)
              engine.scores(x + r0 * ldx, static_cast<size_t>(ldx), static_cast<size_t>(n), b,
                            static_cast<size_t>(lt), static_cast<size_t>(pairs),
                            static_cast<size_t>(need), sc, out + r0 * lt, static_cast<size_t>(lt));
            for (int64_t r = r0; r < r0 + n; ++r)
              std::fill(out + r * lt + need, out + r * lt + cols_pad, fill);
          });
        };
        // P: a tile cut only by structural masks takes the rows' last keys as limits (no mask
        // pass, no exponentials past them; the same bits).
        const bool limits = row_limits(p, tile, w.limits);
        const bool no_masks =
            !tile.partial && o.alibi_slopes == nullptr && o.mask.kind == MaskKind::none;
        if (engine.amx && o.softcap == 0 && o.dropout_p == 0 && (limits || no_masks)) {
          // On AMX, S → P and dP → dS in one pass whose blocks stay in L1 (the same bits as
          // below): P's row pairs, dS's row pairs and rows; then dVᵀ += dOᵀ · P, dKᵀ += Qᵀ · dS,
          // with the pending tile's rows when this tile follows it with the same keys.
          if (pending_at >= 0 && (pending_at + br != at || pending_cols != cols_pad)) flush();
          const int64_t shift = pending_at >= 0 ? br / 2 * lt : 0;  // after the pending pairs
          kernels::amx::backward_tile({.q = w.qp + (hg * cr + at) * a.p16,
                                       .dout = w.dop + (hg * cr + at) * a.pv16,
                                       .ldq = static_cast<size_t>(a.p16),
                                       .ldd = static_cast<size_t>(a.pv16),
                                       .rows = static_cast<size_t>(rows),
                                       .kt = kt,
                                       .vt = vt,
                                       .ldk = static_cast<size_t>(lt),
                                       .ldv = static_cast<size_t>(lt),
                                       .q_pairs = static_cast<size_t>(a.p16),
                                       .v_pairs = static_cast<size_t>(a.pv16),
                                       .cols = static_cast<size_t>(cols_pad),
                                       .keys = static_cast<size_t>(tcols),
                                       .limits = limits ? w.limits : nullptr,
                                       .scale = scale,
                                       .lse = lse,
                                       .dot = dot_rows,
                                       .p_pairs = w.pairs + shift,
                                       .ds_pairs = w.ds_pairs + shift,
                                       .ldw = static_cast<size_t>(lt),
                                       .ds = w.ds,
                                       .ldds = static_cast<size_t>(lb)});
          if (pending_at >= 0) {
            transposed_products(pending_at, br + r32, cols_pad);
            pending_at = -1;
          } else if (r32 == br && i0 + br < it.row_end) {
            pending_at = at, pending_cols = cols_pad;
          } else {
            transposed_products(at, r32, cols_pad);
          }
        } else {
          flush();  // its products read w.pairs
          // S (scaled) and P.
          scores(w.qp + (hg * cr + at) * a.p16, a.p16, kt, a.p16, scale, w.s, kNegInf);
          if (o.softcap > 0) {
            kernels::softcap_tile(w.s, rows, cols_pad, lt, o.softcap);
            for (int64_t r = 0; r < rows; ++r)
              std::memcpy(w.aux + r * lt, w.s + r * lt, static_cast<size_t>(cols_pad) * 4);
            kernels::softcap_grad_tile(w.aux, rows, cols_pad, lt, o.softcap);
          }
          if (!limits) apply_element_masks(p, tile, cols_pad, w.s, lt);
          kernels::native::exp_shift_rows(w.s, static_cast<size_t>(rows),
                                          static_cast<size_t>(cols_pad), static_cast<size_t>(lt),
                                          lse, limits ? w.limits : nullptr);
          // dP' = dO · Vᵀ.
          scores(w.dop + (hg * cr + at) * a.pv16, a.pv16, vt, a.pv16, 1.0f, w.dp, 0.0f);
          const float* pd = backward_dropout(p, tile, w.s, w.pd, w.dp, cols_pad, lt);
          // dVᵀ += dOᵀ · P'.
          accumulate_transposed(pd, w.dot + hg * a.dv16 * lq + at, a.dv16, w.dvt);
          // dS, then dKᵀ += Qᵀ · dS and dQ += dS · K.
          kernels::softmax_grad_tile(w.s, w.dp, rows, cols_pad, lt, dot_rows);
          if (o.softcap > 0) kernels::mul_tile(w.dp, w.aux, rows, cols_pad, lt);
          accumulate_transposed(w.dp, w.qt + hg * a.d16 * lq + at, a.d16, w.dkt);
          // dS rounded by vcvtne2ps2bf16 (denormals to zero, as both engines' products read them:
          // the same products as to_bf16's exact bits, at a fraction of its per-row cost).
          kernels::native::round_tile_bf16(w.dp, static_cast<size_t>(lt), static_cast<size_t>(rows),
                                           static_cast<size_t>(cols_pad), w.ds,
                                           static_cast<size_t>(lb));
          for (int64_t r = 0; r < r16; ++r) {
            bf16* out = w.ds + r * lb;
            std::fill(out + (r < rows ? cols_pad : 0), out + cols32, bf16{});
          }
        }
        float* dq_rows = w.dq + (hg * cr + at) * lk;
        if (first >= tcols)
          engine.accumulate(w.ds, static_cast<size_t>(lb), static_cast<size_t>(r16), kp,
                            static_cast<size_t>(lk), static_cast<size_t>(cols32 / 32),
                            static_cast<size_t>(a.d16), dq_rows, static_cast<size_t>(lk));
        else
          for_diagonal_blocks(rows, tcols, first, [&](int64_t r0, int64_t n, int64_t keys) {
            engine.accumulate(w.ds + r0 * lb, static_cast<size_t>(lb), static_cast<size_t>(n), kp,
                              static_cast<size_t>(lk), static_cast<size_t>(round_up(keys, 32) / 32),
                              static_cast<size_t>(a.d16), dq_rows + r0 * lk,
                              static_cast<size_t>(lk));
          });
      }
      flush();
    }
    // dK = scale · dKᵀᵀ and dV = dVᵀᵀ, 16 rows of the transposes at a time (each row of dK and dV
    // written a cache line at a time); dV's words moved unchanged. bf16 rows go through key_rows
    // (dK unscaled there: the rounding scales it).
    // Rows added to the earlier chunks' (dk_out.add) go through key_rows too.
    const bool rounded = dk_out.to != nullptr, staged = rounded || dk_out.add;
    float* dk_rows = staged ? w.key_rows : dk_out.data + j0 * dk_out.ld;
    const int64_t ldk = staged ? D : dk_out.ld;
    for (int64_t e0 = 0; e0 < D; e0 += 16)
      kernels::transpose_rows(w.dkt + e0 * lt, static_cast<size_t>(lt),
                              static_cast<size_t>(std::min<int64_t>(16, D - e0)),
                              static_cast<size_t>(cols), rounded ? 1.0f : scale, dk_rows + e0,
                              static_cast<size_t>(ldk));
    if (rounded) {
      std::fill_n(w.row_scale, cols, scale);
      round_rows(w.key_rows, D, cols, D, w.row_scale, dk_out.to->bf16_at(it.b, it.g, j0),
                 dk_out.to->row_stride);
    } else if (dk_out.add) {
      dk_out.put(j0, cols, D, w.key_rows, D);
    }
    float* dv_rows = staged ? w.key_rows : dv_out.data + j0 * dv_out.ld;
    const int64_t ldv = staged ? Dv : dv_out.ld;
    for (int64_t x0 = 0; x0 < Dv; x0 += 16)
      kernels::transpose_words(
          reinterpret_cast<const uint32_t*>(w.dvt + x0 * lt), static_cast<size_t>(lt),
          static_cast<size_t>(std::min<int64_t>(16, Dv - x0)), static_cast<size_t>(cols),
          reinterpret_cast<uint32_t*>(dv_rows + x0), static_cast<size_t>(ldv));
    if (rounded) {
      std::fill_n(w.row_scale, cols, 1.0f);
      round_rows(w.key_rows, Dv, cols, Dv, w.row_scale, dv_out.to->bf16_at(it.b, it.g, j0),
                 dv_out.to->row_stride);
    } else if (dv_out.add) {
      dv_out.put(j0, cols, Dv, w.key_rows, Dv);
    }
  }
  // dQ = scale · (dQ / scale); bf16 rows scaled and rounded in one pass, bc rows a call (the bits
  // of to_bf16 on the scaled floats).
  if (p.dq.bf16) std::fill_n(w.row_scale, bc, scale);
  for (int64_t hg = 0; hg < G; ++hg) {
    const int64_t h = it.g * G + hg;
    const float* dq = w.dq + hg * cr * lk;
    for (int64_t r0 = 0; r0 < rows_total; r0 += bc) {
      const int64_t n = std::min(bc, rows_total - r0);
      if (p.dq.bf16) {
        round_rows(dq + r0 * lk, lk, n, D, w.row_scale, p.dq.bf16_at(it.b, h, it.row_begin + r0),
                   p.dq.row_stride);
        continue;
      }
      for (int64_t r = r0; r < r0 + n; ++r) {
        float* dst = p.dq.at(it.b, h, it.row_begin + r);
        for (int64_t e = 0; e < D; ++e) dst[e] = dq[r * lk + e] * scale;
      }
    }
  }
}

}  // namespace

bool bf16_backward_available(const AttentionParams& p) {
  return p.q.is_bf16() && kernels::float_lanes() == 16 &&
         (kernels::amx::available() || kernels::bf16_native());
}

void flash_backward_bf16(ThreadContext& ctx, const AttentionParams& p) {
  apply_isa_from_environment();
  validate(p, /*backward=*/true);
  check(bf16_backward_available(p),
        "flash_backward_bf16: needs bf16 inputs and AMX tiles or AVX-512 BF16");
  check(p.out.defined() && p.lse != nullptr,
        "flash_backward_bf16: the forward's output and log-sum-exp (out, lse) are required");
  const AttentionShape& sh = p.shape;
  const int64_t D = sh.head_dim, Dv = sh.value_dim;
  if (sh.batch == 0 || sh.kv_heads == 0) return;
  auto zero_keys = [&] {
    for (int64_t b = 0; b < sh.batch; ++b)
      for (int64_t g = 0; g < sh.kv_heads; ++g)
        for (int64_t j = 0; j < sh.len_kv; ++j) {
          for (int64_t e = 0; e < D; ++e) p.dk.store(b, g, j, e, 0.0f);
          for (int64_t x = 0; x < Dv; ++x) p.dv.store(b, g, j, x, 0.0f);
        }
  };
  if (sh.len_q == 0 || sh.heads == 0) return zero_keys();
  if (sh.len_kv == 0) {
    for (int64_t b = 0; b < sh.batch; ++b)
      for (int64_t h = 0; h < sh.heads; ++h)
        for (int64_t i = 0; i < sh.len_q; ++i)
          for (int64_t e = 0; e < D; ++e) p.dq.store(b, h, i, e, 0.0f);
    return;
  }
  const Engine engine{.amx = kernels::amx::available()};
  const Bf16BackwardPlan a = make_bf16_plan(p, engine.amx);
  const std::vector<float> dots = output_dots(ctx, p);
  // Packed key blocks, then the chunks' partial dK and dV [chunks, batch, kv_heads, len_kv, ·].
  // With one chunk, few key blocks and enough (batch, kv head) pairs per thread, each item packs
  // its own pair's key blocks into its scratch (as the forward does: flash_tiles.h); otherwise
  // every block is packed once into a shared buffer first.
  const int64_t pairs_bg = sh.batch * sh.kv_heads;
  const bool local = a.chunks == 1 && a.kv_blocks <= kLocalPackBlocks &&
                     pairs_bg >= kLocalPackItemsPerThread * ctx.num_threads();
  const int64_t pack_items = local ? 0 : pairs_bg * a.kv_blocks;
  const int64_t packed_words = checked_numel({pack_items, a.block_words}, "packed keys");
  const int64_t per_bg_k = sh.len_kv * D, per_bg_v = sh.len_kv * Dv;
  // One chunk: the items write dK and dV themselves (no partials to add; bf16 ones rounded).
  const bool direct = a.chunks == 1;
  // Several chunks and at least kMergedPairsPerThread pairs a thread: an item is a whole pair that
  // runs its chunks in turn, each adding its dK and dV rows to the earlier chunks' sum as
  // add_partials would (the same bits for any thread count): in the fp32 gradients where they
  // lie, or in a float copy in the item's scratch rounded at the end. No partials go through
  // memory and no pass adds them.
  const bool merged = !direct && pairs_bg >= kMergedPairsPerThread * ctx.num_threads();
  const bool partials = !direct && !merged;
  const int64_t part_k =
      partials ? checked_numel({a.chunks, sh.batch * sh.kv_heads, per_bg_k}, "partial dK") : 0;
  const int64_t part_v =
      partials ? checked_numel({a.chunks, sh.batch * sh.kv_heads, per_bg_v}, "partial dV") : 0;
  float* base = ctx.shared_scratch().floats(static_cast<size_t>(packed_words + part_k + part_v));
  auto* packed = reinterpret_cast<uint32_t*>(base);
  float* const dk_part = base + packed_words;
  float* const dv_part = dk_part + part_k;
  auto pack = [&](int64_t b, int64_t g, int64_t blk, uint32_t* dst) {
    const int64_t j0 = blk * kBlockKeys, cols = std::min(kBlockKeys, sh.len_kv - j0);
    pack_pairs_transposed(p.k, b, g, j0, cols, D, a.p16, a.lt, dst);
    pack_pairs_transposed(p.v, b, g, j0, cols, Dv, a.pv16, a.lt, dst + a.p16 * a.lt);
    pack_row_pairs(p.k, b, g, j0, cols, D, a.bc, a.lk, dst + (a.p16 + a.pv16) * a.lt);
  };
  ctx.parallel_items(pack_items, [&](int64_t item, int) {
    const int64_t blk = item % a.kv_blocks, bg = item / a.kv_blocks;
    pack(bg / sh.kv_heads, bg % sh.kv_heads, blk, packed + item * a.block_words);
  });
  const size_t bytes = round_up(static_cast<int64_t>(scratch_bytes(a)), 64);
  const auto local_bytes = static_cast<size_t>(local ? 4 * a.kv_blocks * a.block_words : 0);
  // A merged item's float copy of bf16 dK and dV rows [len_kv, D], [len_kv, Dv].
  const auto sums_bytes = static_cast<size_t>(
      merged ? 4 * ((p.dk.bf16 ? per_bg_k : 0) + (p.dv.bf16 ? per_bg_v : 0)) : 0);
  // Chunk c of pair bg; its dK and dV rows into dk and dv.
  auto run_chunk = [&](int64_t bg, int64_t c, const KeyRows& dk, const KeyRows& dv, char* scratch) {
    const Item it{bg / sh.kv_heads, bg % sh.kv_heads, c, c * a.chunk_rows,
                  std::min(sh.len_q, (c + 1) * a.chunk_rows)};
    if (it.row_begin >= it.row_end) {
      dk.zero(0, sh.len_kv, D);
      dv.zero(0, sh.len_kv, Dv);
      return;
    }
    const uint32_t* blocks = packed + bg * a.kv_blocks * a.block_words;
    if (local) {
      auto* mine = reinterpret_cast<uint32_t*>(scratch + bytes);
      for (int64_t blk = 0; blk < a.kv_blocks; ++blk)
        pack(it.b, it.g, blk, mine + blk * a.block_words);
      blocks = mine;
    }
    run_item(p, a, engine, carve(scratch, a), blocks, dots.data(), dk, dv, it);
  };
  if (merged) {
    ctx.parallel_items(pairs_bg, [&](int64_t bg, int worker) {
      auto* scratch = reinterpret_cast<char*>(
          ctx.scratch(worker).floats((bytes + local_bytes + sums_bytes) / 4));
      const int64_t b = bg / sh.kv_heads, g = bg % sh.kv_heads;
      auto* sums = reinterpret_cast<float*>(scratch + bytes + local_bytes);
      auto rows_of = [&](const Operand& o, float* copy, int64_t width) {
        return o.bf16 ? KeyRows{.data = copy, .ld = width}
                      : KeyRows{.data = o.at(b, g, 0), .ld = o.row_stride};
      };
      KeyRows dk = rows_of(p.dk, sums, D);
      KeyRows dv = rows_of(p.dv, p.dk.bf16 ? sums + per_bg_k : sums, Dv);
      for (int64_t c = 0; c < a.chunks; ++c) {
        dk.add = dv.add = c > 0;
        run_chunk(bg, c, dk, dv, scratch);
      }
      // bf16 gradients: the sums rounded once (add_partials' to_bf16 of its sums).
      for (const auto& [o, rows, width] : {std::tuple{&p.dk, dk, D}, std::tuple{&p.dv, dv, Dv}}) {
        if (!o->bf16) continue;
        for (int64_t j = 0; j < sh.len_kv; ++j)
          to_bf16(rows.data + j * width, o->bf16_at(b, g, j), static_cast<size_t>(width));
      }
    });
    return;
  }
  ctx.parallel_items(pairs_bg * a.chunks, [&](int64_t item, int worker) {
    // Last chunks first: with a causal mask they see the most keys, so the big items start early
    // (N = 8192, one head, causal: 4 items of work 1, 3, 5 and 7 shared by 2 threads).
    const int64_t c = a.chunks - 1 - item % a.chunks, bg = item / a.chunks;
    const int64_t b = bg / sh.kv_heads, g = bg % sh.kv_heads;
    auto key_rows = [&](const Operand& o, float* part, int64_t width) {
      if (!direct) return KeyRows{.data = part, .ld = width};
      if (o.bf16) return KeyRows{.to = &o, .b = b, .g = g};
      return KeyRows{.data = o.at(b, g, 0), .ld = o.row_stride};
    };
    const int64_t at = c * pairs_bg + bg;
    auto* scratch = reinterpret_cast<char*>(ctx.scratch(worker).floats((bytes + local_bytes) / 4));
    run_chunk(bg, c, key_rows(p.dk, dk_part + at * per_bg_k, D),
              key_rows(p.dv, dv_part + at * per_bg_v, Dv), scratch);
  });
  // dK and dV: the chunks' partials added in chunk order, stored (rounded for bf16).
  if (partials) add_partials(ctx, p, a.chunks, dk_part, dv_part);
}

}  // namespace headlight::attention::cpu

// The AMX bf16 tiles: the two products of a tile on the matrix unit (tdpbf16ps: a 16×16 fp32 tile
// += a 16×32 bf16 tile times a 32×16 one, in pairs; 16,384 multiply-adds per instruction, about
// 15× the fp32 FMA rate per core on Sapphire Rapids). The layouts are flash_bf16.h's pair words,
// which are AMX's: a B tile is 16 rows of pair words (16 pairs of the reduction dim) × 16 columns.
//
// Register blocking: 2 × 2 accumulator tiles (tiles 0–3, 32 rows × 32 columns), two A tiles (4, 5)
// and two B tiles (6, 7) loaded per step of 32 reduction elements: four loads of 1 KB for four
// tdpbf16ps. Rows, reduction and columns are whole tiles (the plan pads them with zeros; the
// caller's junk rows beyond its real rows only produce junk rows of the result, never read).
//   QK   S[r, c]  = scale · Σ_e Q[r, e] K[c, e]    A = Q pair words, B = packed Kᵀ pair words
//   PV   O[r, x] = α_r O[r, x] + Σ_c P[r, c] V[c, x]   A = P (bf16 rows), B = packed V pair words;
//        O is scaled by α with AVX-512 first, then loaded into the accumulator tiles.
// Each worker thread configures its tiles (amx_configure_tiles) before an item's first product.

#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "src/attention/cpu/flash_bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass an uninitialised _mm512_undefined_*() as the unused merge
// operand, which -W(maybe-)uninitialized reports wherever they are inlined: silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define HEADLIGHT_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))

namespace headlight::attention::cpu::kernels::amx {
namespace {

// One RT × CT block (RT, CT ∈ {1, 2} tiles of 16) of c = a · b over `steps` steps of 16 words;
// with kLoadC the accumulators start from c, else from zero.
template <int RT, int CT, bool kLoadC>
HEADLIGHT_AMX_TARGET inline void Block(const void* a, size_t lda_bytes, const uint32_t* b,
                                       size_t ldb, size_t steps, size_t a_step_bytes, float* c,
                                       size_t ldc) {
  const auto* a0 = static_cast<const char*>(a);
  const char* a1 = a0 + 16 * lda_bytes;
  const size_t ldc_bytes = ldc * sizeof(float), ldb_bytes = ldb * sizeof(uint32_t);
  if constexpr (kLoadC) {
    _tile_loadd(0, c, ldc_bytes);
    if constexpr (CT == 2) _tile_loadd(1, c + 16, ldc_bytes);
    if constexpr (RT == 2) _tile_loadd(2, c + 16 * ldc, ldc_bytes);
    if constexpr (RT == 2 && CT == 2) _tile_loadd(3, c + 16 * ldc + 16, ldc_bytes);
  } else {
    _tile_zero(0);
    if constexpr (CT == 2) _tile_zero(1);
    if constexpr (RT == 2) _tile_zero(2);
    if constexpr (RT == 2 && CT == 2) _tile_zero(3);
  }
  for (size_t k = 0; k < steps; ++k) {
    _tile_loadd(4, a0 + k * a_step_bytes, lda_bytes);
    if constexpr (RT == 2) _tile_loadd(5, a1 + k * a_step_bytes, lda_bytes);
    const uint32_t* bk = b + k * 16 * ldb;
    _tile_loadd(6, bk, ldb_bytes);
    if constexpr (CT == 2) _tile_loadd(7, bk + 16, ldb_bytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (CT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (RT == 2 && CT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc_bytes);
  if constexpr (CT == 2) _tile_stored(1, c + 16, ldc_bytes);
  if constexpr (RT == 2) _tile_stored(2, c + 16 * ldc, ldc_bytes);
  if constexpr (RT == 2 && CT == 2) _tile_stored(3, c + 16 * ldc + 16, ldc_bytes);
}

// c[rows, cols] (= or +=) a · b in 2 × 2 blocks with 1-tile edges.
template <bool kLoadC>
HEADLIGHT_AMX_TARGET void Product(const void* a, size_t lda_bytes, size_t rows, const uint32_t* b,
                                  size_t ldb, size_t steps, size_t a_step_bytes, size_t cols,
                                  float* c, size_t ldc) {
  const auto* a_bytes = static_cast<const char*>(a);
  for (size_t r = 0; r < rows; r += 32) {
    const bool two_rows = r + 32 <= rows;
    const char* ar = a_bytes + r * lda_bytes;
    float* cr = c + r * ldc;
    size_t x = 0;
    for (; x + 32 <= cols; x += 32) {
      if (two_rows)
        Block<2, 2, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
      else
        Block<1, 2, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
    }
    if (x < cols) {
      if (two_rows)
        Block<2, 1, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
      else
        Block<1, 1, kLoadC>(ar, lda_bytes, b + x, ldb, steps, a_step_bytes, cr + x, ldc);
    }
  }
}

}  // namespace

bool available() {
  return amx_allowed() && amx_available();
}

HEADLIGHT_AMX_TARGET void product(const bf16* a, size_t lda, size_t rows, const uint32_t* b,
                                  size_t ldb, size_t steps, size_t cols, float* c, size_t ldc,
                                  bool accumulate) {
  if (accumulate)
    Product<true>(a, lda * sizeof(bf16), rows, b, ldb, steps, 64, cols, c, ldc);
  else
    Product<false>(a, lda * sizeof(bf16), rows, b, ldb, steps, 64, cols, c, ldc);
}

HEADLIGHT_AMX_TARGET void qk_tile(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt,
                                  size_t ldk, size_t pairs, size_t cols, float scale, float* s,
                                  size_t lds) {
  // A step is 16 pair words of each query row (64 bytes).
  Product<false>(q, ldq * sizeof(uint32_t), rows, kt, ldk, pairs / 16, 64, cols, s, lds);
  if (scale == 1.0f) return;
  const __m512 vs = _mm512_set1_ps(scale);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; c += 16)
      _mm512_storeu_ps(s + r * lds + c, _mm512_mul_ps(_mm512_loadu_ps(s + r * lds + c), vs));
}

HEADLIGHT_AMX_TARGET void pv_tile(const bf16* p, size_t ldp, size_t rows, size_t pairs,
                                  const uint32_t* v, size_t ldv, size_t width, float* o, size_t ldo,
                                  const float* alpha) {
  if (alpha)
    for (size_t r = 0; r < rows; ++r) {
      if (alpha[r] == 1.0f) continue;  // the row's maximum did not move (most rows, after a while)
      const __m512 a = _mm512_set1_ps(alpha[r]);
      for (size_t x = 0; x < width; x += 16)
        _mm512_storeu_ps(o + r * ldo + x, _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + x), a));
    }
  // The scaling left the upper halves of the vector registers dirty, and the product below (a
  // tail call the compiler would make) touches none, so nothing else would clear them: without
  // this the caller's SSE code (the per-row epilogue, libm's log) ran at a fraction of its speed.
  _mm256_zeroupper();
  // A step is 32 keys of each probability row (64 bytes).
  Product<true>(p, ldp * sizeof(bf16), rows, v, ldv, pairs / 16, 64, width, o, ldo);
}

}  // namespace headlight::attention::cpu::kernels::amx

#else  // not x86-64: no AMX

namespace headlight::attention::cpu::kernels::amx {

bool available() {
  return false;
}
void qk_tile(const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float,
             float*, size_t) {
  fail("amx::qk_tile: no AMX on this architecture");
}
void pv_tile(const bf16*, size_t, size_t, size_t, const uint32_t*, size_t, size_t, float*, size_t,
             const float*) {
  fail("amx::pv_tile: no AMX on this architecture");
}
void product(const bf16*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float*, size_t,
             bool) {
  fail("amx::product: no AMX on this architecture");
}

}  // namespace headlight::attention::cpu::kernels::amx

#endif

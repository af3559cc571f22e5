// The AMX tiles' register block, shared by the forward's tiles (flash_bf16_amx.cc) and the bf16
// backward's (flash_backward_bf16_amx.cc): one RT × CT block of accumulator tiles (tiles 0–3),
// two A tiles (4, 5) and two B tiles (6, 7) loaded per step of 32 reduction elements. x86-64 only;
// include it after <immintrin.h>.
#pragma once

#include <cstddef>
#include <cstdint>

#define HEADLIGHT_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))

namespace headlight::attention::cpu::kernels::amx::tiles {

// One RT × CT block (RT, CT ∈ {1, 2} tiles of 16) of c = a · b over `steps` steps of 16 words;
// with kLoadC the accumulators start from c, else from zero.
//   a  rows of RT·16 rows, lda_bytes apart; step k at a + k · a_step_bytes
//   b  pair words [16·steps, ldb]: step k's B tiles are rows 16k .. 16k + 15, columns 0–15, 16–31
//   c  [RT·16, ldc] fp32
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

}  // namespace headlight::attention::cpu::kernels::amx::tiles

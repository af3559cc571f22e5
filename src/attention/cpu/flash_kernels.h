// The SIMD inner loops of the fused attention kernels, dispatched at run time to the best target
// Highway compiled in (flash_kernels-inl.h and flash_dot-inl.h hold the loops). Plain functions, so
// that the tiling code in flash_forward.cc and flash_backward.cc stays free of SIMD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "headlight/core/bf16.h"

namespace headlight::attention::cpu::kernels {

// s[rows, cols] = a[rows, dim] (leading dim lda) · bt[dim, cols] (leading dim ldb); cols a
// multiple of the vector length.
void qk_tile(const float* a, size_t lda, size_t rows, const float* bt, size_t ldb, size_t dim,
             size_t cols, float* s, size_t lds);
// Rows another pass will read, prefetched into L2 by the pass that scores their keys: row c at
// data + c·ld, `width` elements (data null: none). Decode passes its value rows, so that P·V finds
// them in L2 (see DotTileT).
template <class T>
struct RowsAhead {
  const T* data = nullptr;
  size_t ld = 0, width = 0;
  // Prefetch the key rows and these whatever the shape (Plan::prefetch_rows).
  bool always = false;
};
// s[r, c] = a[r, :] · k[c·ldk, :] for c < cols (any cols and dim): scores from key rows in place;
// prefetches row c of `ahead` as it scores key c, when the key rows are short (flash_dot-inl.h).
void dot_tile(const float* a, size_t lda, size_t rows, const float* k, size_t ldk, size_t dim,
              size_t cols, float* s, size_t lds, RowsAhead<float> ahead = {});
// dot_tile over bf16 key rows (a bf16 KV cache read in place), each element widened exactly as it
// is loaded: the same arithmetic on half the bytes.
void dot_tile_bf16(const float* a, size_t lda, size_t rows, const bf16* k, size_t ldk, size_t dim,
                   size_t cols, float* s, size_t lds, RowsAhead<bf16> ahead = {});
// pv_tile (below) for decode's value rows read where they lie, fp32 or bf16 (widened exactly as
// loaded): the same bits as pv_tile, each value row read whole in address order.
void pv_tile_in_place(const float* p, size_t ldp, size_t rows, size_t cols, const float* v,
                      size_t ldv, size_t width, float* o, size_t ldo, const float* alpha);
void pv_tile_in_place(const float* p, size_t ldp, size_t rows, size_t cols, const bf16* v,
                      size_t ldv, size_t width, float* o, size_t ldo, const float* alpha);
// s ← cap · tanh(s / cap).
void softcap_tile(float* s, size_t rows, size_t cols, size_t lds, float cap);
// What softmax_rows does beyond the plain online softmax.
struct SoftmaxExtras {
  // Statistics (both or neither): see flash_kernels-inl.h; argmax is a column of this tile, −1
  // when the maximum did not move.
  float* ent = nullptr;
  int32_t* argmax = nullptr;
  // The tile holds raw scores: each score is scale · s (scale > 0, so the maximum is the same
  // key's). Lets the bf16 products skip a pass that scales S.
  float scale = 1.0f;
  // When set, P is written here rounded to bf16 (round to nearest even) [rows, ldpb] instead of
  // into S as fp32.
  bf16* pb = nullptr;
  size_t ldpb = 0;
  // With pb and no statistics: the running sums of P as rounded, [rows, lanes] laid out as l
  // (native::softmax_rows's lr: the output is then divided by what P·V weighed).
  float* lr = nullptr;
};

// Rows one softmax loop takes at a time (its per-row arrays live on the stack): softmax_rows and
// native::softmax_rows split larger tiles.
constexpr size_t kSoftmaxRowsPerCall = 256;
// The online softmax of a tile: updates m and the per-lane sums l [rows, lanes], writes α and
// turns S into P (see flash_kernels-inl.h).
void softmax_rows(float* s, size_t rows, size_t cols, size_t lds, float* m, float* l, float* alpha,
                  const SoftmaxExtras& extras = {});
// o[rows, width] = α ⊙ o + p[rows, cols] · v[cols, width] (α null: o += p · v).
void pv_tile(const float* p, size_t ldp, size_t rows, size_t cols, const float* v, size_t ldv,
             size_t width, float* o, size_t ldo, const float* alpha);
// s[r, :] ← exp(s[r, :] − lse[r]) (0 for lse = −inf, NaN for lse = NaN).
void exp_shift_rows(float* s, size_t rows, size_t cols, size_t lds, const float* lse);
// c[cols, width] += a[rows, cols]ᵀ · b[rows, width]; width a multiple of the vector length.
void accumulate_transposed(const float* a, size_t lda, size_t rows, size_t cols, const float* b,
                           size_t ldb, size_t width, float* c, size_t ldc);
// In place of dp: ds = p ⊙ (dp − dot[row]).
void softmax_grad_tile(const float* p, float* dp, size_t rows, size_t cols, size_t lds,
                       const float* dot);
// a ← a ⊙ b over rows × cols (leading dim lds for both).
void mul_tile(float* a, const float* b, size_t rows, size_t cols, size_t lds);
// inv[r] = 1 / l[r] (0 where l ≤ 0: the scalar division's bits) and lse[r] = m[r] + log l[r] by a
// vector logarithm (within a few ulp of logf; −inf where l = 0, NaN where l is NaN): the bf16
// forward's rows finished in one pass (the float32 forward keeps logf's bits). With norm, inv[r]
// = 1 / norm[r] where l[r] > 0 (the sums of P as rounded, Plan::rounded_sums).
void finish_rows(const float* m, const float* l, size_t n, float* inv, float* lse,
                 const float* norm = nullptr);
// out[r] = Σ_x a[r, x] · b[r, x], x < width: each operand's rows fp32 (a32, b32) or bf16 (a16,
// b16: the one that is not null), widened exactly; one running sum per vector lane (fused
// multiply-adds), the lanes added at the end.
void dot_rows(const float* a32, const bf16* a16, size_t lda, const float* b32, const bf16* b16,
              size_t ldb, size_t rows, size_t width, float* out);
// dst[r, c] = x[r, c] · scale[r] over rows × cols (dst may be x: in place).
void scale_rows(const float* x, size_t ldx, size_t rows, size_t cols, const float* scale,
                float* dst, size_t ldd);
// s ← 1 − (s / cap)², the derivative of cap·tanh(x / cap) from its value.
void softcap_grad_tile(float* s, size_t rows, size_t cols, size_t lds, float cap);
// dst[e·ld_dst + c] = scale · src[c·ld_src + e] for c < rows, e < width (packing Kᵀ, Vᵀ).
void transpose_rows(const float* src, size_t ld_src, size_t rows, size_t width, float scale,
                    float* dst, size_t ld_dst);
// transpose_rows for 32-bit words (bf16 pairs), moved unchanged.
void transpose_words(const uint32_t* src, size_t ld_src, size_t rows, size_t width, uint32_t* dst,
                     size_t ld_dst);
// dst[e] = lo[e] | hi[e] << 16, e < width: two rows of bf16 bits as pair words.
void pair_rows(const uint16_t* lo, const uint16_t* hi, size_t width, uint32_t* dst);
// Float lanes of the dispatched target; tiles are padded to multiples of it.
size_t float_lanes();
// The dispatched target's name ("AVX3", "AVX2", …).
std::string target_name();

}  // namespace headlight::attention::cpu::kernels

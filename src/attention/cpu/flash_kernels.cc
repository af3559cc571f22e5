// Dynamic dispatch of the fused attention kernels' SIMD loops (flash_kernels-inl.h; decode's scores
// in flash_dot-inl.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/attention/cpu/flash_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "src/attention/cpu/flash_bf16-inl.h"
#include "src/attention/cpu/flash_dot-inl.h"
#include "src/attention/cpu/flash_kernels-inl.h"

#if HWY_ONCE

#include "headlight/core/cpu_info.h"
#include "src/attention/cpu/flash_bf16.h"
#include "src/attention/cpu/flash_kernels.h"

namespace headlight {

HWY_EXPORT(QkTile);
HWY_EXPORT(DotTile);
HWY_EXPORT(DotTileBf16);
HWY_EXPORT(PvInPlace);
HWY_EXPORT(PvInPlaceBf16);
HWY_EXPORT(SoftcapTile);
HWY_EXPORT(SoftmaxRows);
HWY_EXPORT(PvTile);
HWY_EXPORT(ExpShiftRows);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(AccumulateTransposed);
HWY_EXPORT(SoftmaxGradTile);
HWY_EXPORT(MulTile);
HWY_EXPORT(ScaleRows);
HWY_EXPORT(RowDots);
HWY_EXPORT(FinishRows);
HWY_EXPORT(SoftcapGradTile);
HWY_EXPORT(TransposeRows);
HWY_EXPORT(TransposeWords);
HWY_EXPORT(PairRows);
HWY_EXPORT(QkTileBf16);
HWY_EXPORT(PvTileBf16);
HWY_EXPORT(RoundTileBf16);

namespace attention::cpu::kernels {

void qk_tile(const float* a, size_t lda, size_t rows, const float* bt, size_t ldb, size_t dim,
             size_t cols, float* s, size_t lds) {
  HWY_DYNAMIC_DISPATCH(QkTile)(a, lda, rows, bt, ldb, dim, cols, s, lds);
}

void dot_tile(const float* a, size_t lda, size_t rows, const float* k, size_t ldk, size_t dim,
              size_t cols, float* s, size_t lds, RowsAhead<float> ahead) {
  HWY_DYNAMIC_DISPATCH(DotTile)(a, lda, rows, k, ldk, dim, cols, s, lds, ahead);
}

void dot_tile_bf16(const float* a, size_t lda, size_t rows, const bf16* k, size_t ldk, size_t dim,
                   size_t cols, float* s, size_t lds, RowsAhead<bf16> ahead) {
  HWY_DYNAMIC_DISPATCH(DotTileBf16)(a, lda, rows, k, ldk, dim, cols, s, lds, ahead);
}

void pv_tile_in_place(const float* p, size_t ldp, size_t rows, size_t cols, const float* v,
                      size_t ldv, size_t width, float* o, size_t ldo, const float* alpha) {
  HWY_DYNAMIC_DISPATCH(PvInPlace)(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

void pv_tile_in_place(const float* p, size_t ldp, size_t rows, size_t cols, const bf16* v,
                      size_t ldv, size_t width, float* o, size_t ldo, const float* alpha) {
  HWY_DYNAMIC_DISPATCH(PvInPlaceBf16)(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

void softcap_tile(float* s, size_t rows, size_t cols, size_t lds, float cap) {
  HWY_DYNAMIC_DISPATCH(SoftcapTile)(s, rows, cols, lds, cap);
}

void softmax_rows(float* s, size_t rows, size_t cols, size_t lds, float* m, float* l, float* alpha,
                  const SoftmaxExtras& extras) {
  // The loop keeps per-row arrays of kSoftmaxRowsPerCall on the stack; rows are independent, so
  // more (decode: every query head of a group, up to 16 rows each) run as several calls.
  const size_t lanes = float_lanes();
  for (size_t r = 0; r < rows; r += kSoftmaxRowsPerCall) {
    SoftmaxExtras part = extras;
    if (part.ent) part.ent += r;
    if (part.argmax) part.argmax += r;
    if (part.pb) part.pb += r * part.ldpb;
    if (part.lr) part.lr += r * lanes;
    HWY_DYNAMIC_DISPATCH(SoftmaxRows)
    (s + r * lds, std::min(kSoftmaxRowsPerCall, rows - r), cols, lds, m + r, l + r * lanes,
     alpha + r, part);
  }
}

void pv_tile(const float* p, size_t ldp, size_t rows, size_t cols, const float* v, size_t ldv,
             size_t width, float* o, size_t ldo, const float* alpha) {
  HWY_DYNAMIC_DISPATCH(PvTile)(p, ldp, rows, cols, v, ldv, width, o, ldo, alpha);
}

void exp_shift_rows(float* s, size_t rows, size_t cols, size_t lds, const float* lse) {
  HWY_DYNAMIC_DISPATCH(ExpShiftRows)(s, rows, cols, lds, lse);
}

void accumulate_transposed(const float* a, size_t lda, size_t rows, size_t cols, const float* b,
                           size_t ldb, size_t width, float* c, size_t ldc) {
  HWY_DYNAMIC_DISPATCH(AccumulateTransposed)(a, lda, rows, cols, b, ldb, width, c, ldc);
}

void softmax_grad_tile(const float* p, float* dp, size_t rows, size_t cols, size_t lds,
                       const float* dot) {
  HWY_DYNAMIC_DISPATCH(SoftmaxGradTile)(p, dp, rows, cols, lds, dot);
}

void mul_tile(float* a, const float* b, size_t rows, size_t cols, size_t lds) {
  HWY_DYNAMIC_DISPATCH(MulTile)(a, b, rows, cols, lds);
}

void finish_rows(const float* m, const float* l, size_t n, float* inv, float* lse,
                 const float* norm) {
  HWY_DYNAMIC_DISPATCH(FinishRows)(m, l, n, inv, lse, norm);
}

void dot_rows(const float* a32, const bf16* a16, size_t lda, const float* b32, const bf16* b16,
              size_t ldb, size_t rows, size_t width, float* out) {
  HWY_DYNAMIC_DISPATCH(RowDots)(a32, a16, lda, b32, b16, ldb, rows, width, out);
}

void scale_rows(const float* x, size_t ldx, size_t rows, size_t cols, const float* scale,
                float* dst, size_t ldd) {
  HWY_DYNAMIC_DISPATCH(ScaleRows)(x, ldx, rows, cols, scale, dst, ldd);
}

void softcap_grad_tile(float* s, size_t rows, size_t cols, size_t lds, float cap) {
  HWY_DYNAMIC_DISPATCH(SoftcapGradTile)(s, rows, cols, lds, cap);
}

void transpose_words(const uint32_t* src, size_t ld_src, size_t rows, size_t width, uint32_t* dst,
                     size_t ld_dst) {
  HWY_DYNAMIC_DISPATCH(TransposeWords)(src, ld_src, rows, width, dst, ld_dst);
}

void transpose_rows(const float* src, size_t ld_src, size_t rows, size_t width, float scale,
                    float* dst, size_t ld_dst) {
  HWY_DYNAMIC_DISPATCH(TransposeRows)(src, ld_src, rows, width, scale, dst, ld_dst);
}

void pair_rows(const uint16_t* lo, const uint16_t* hi, size_t width, uint32_t* dst) {
  HWY_DYNAMIC_DISPATCH(PairRows)(lo, hi, width, dst);
}

bool bf16_native() {
  static const bool cpu = cpu_has_bf16_dot();
  return cpu && native_bf16_allowed();
}

void qk_tile_bf16(const uint32_t* q, size_t ldq, size_t rows, const uint32_t* kt, size_t ldk,
                  size_t pairs, size_t cols, float scale, float* s, size_t lds) {
  if (bf16_native()) return native::qk_tile_bf16(q, ldq, rows, kt, ldk, pairs, cols, scale, s, lds);
  HWY_DYNAMIC_DISPATCH(QkTileBf16)(q, ldq, rows, kt, ldk, pairs, cols, scale, s, lds);
}

void pv_tile_bf16(const uint32_t* p, size_t ldp, size_t rows, size_t pairs, const uint32_t* v,
                  size_t ldv, size_t width, float* o, size_t ldo, const float* alpha) {
  if (bf16_native()) return native::pv_tile_bf16(p, ldp, rows, pairs, v, ldv, width, o, ldo, alpha);
  HWY_DYNAMIC_DISPATCH(PvTileBf16)(p, ldp, rows, pairs, v, ldv, width, o, ldo, alpha);
}

void round_tile_bf16(const float* s, size_t lds, size_t rows, size_t cols, bf16* dst, size_t ldd) {
  if (bf16_native()) return native::round_tile_bf16(s, lds, rows, cols, dst, ldd);
  HWY_DYNAMIC_DISPATCH(RoundTileBf16)(s, lds, rows, cols, dst, ldd);
}

size_t float_lanes() {
  return HWY_DYNAMIC_DISPATCH(FloatLanes)();
}

std::string target_name() {
  const int64_t targets = allowed_targets() & HWY_TARGETS;  // compiled here and allowed
  return hwy::TargetName(targets & -targets);
}

}  // namespace attention::cpu::kernels
}  // namespace headlight

#endif  // HWY_ONCE

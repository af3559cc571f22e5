// bfloat16: the upper 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits). Widening to
// float32 is exact; narrowing rounds to nearest, ties to even (as PyTorch, ml_dtypes and the
// hardware's vcvtne2ps2bf16 do), keeps infinities and turns every NaN into a quiet NaN of the same
// sign. This header is the one home of the conversions; the SIMD kernels do the same rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace headlight {

// One bfloat16 value, as stored (a distinct type, so that a bf16 buffer is never read as float).
struct bf16 {
  uint16_t bits = 0;
};

inline float to_float(bf16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bf16 to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)  // NaN: keep the sign, make it quiet
    return bf16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);  // ties to even
  return bf16{static_cast<uint16_t>((bits + rounding) >> 16)};
}

// dst[i] = to_bf16(src[i]) and dst[i] = to_float(src[i]) over n elements.
void to_bf16(const float* src, bf16* dst, size_t n);
void to_float(const bf16* src, float* dst, size_t n);
class ThreadContext;
// to_bf16 over n elements on the context's threads (chunks of 16,384).
void to_bf16(ThreadContext& ctx, const float* src, bf16* dst, int64_t n);

}  // namespace headlight

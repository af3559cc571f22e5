// ggml's block formats, dequantised to float32.
//
// A quantised tensor is a sequence of blocks along ne[0]; each block carries its own scale(s) as
// float16 and its values as small integers. The value of element e of a block:
//   Q8_0  (32 values, 34 bytes: d, int8 q[32])                 d · q[e]
//   Q4_0  (32 values, 18 bytes: d, 16 bytes of nibbles)        d · (q − 8)      q = nibble e
//   Q4_1  (32 values, 20 bytes: d, m, 16 bytes of nibbles)     d · q + m
//   "Nibble e" is the low nibble of byte e for e < 16 and the high nibble of byte e − 16 after.
//   Q4_K  (256 values, 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
//         nibbles) in 8 sub-blocks of 32: (d · sc[j]) · q − (dmin · m[j]) for sub-block j; bytes
//         32i … 32i + 31 hold sub-block 2i in their low nibbles and 2i + 1 in their high ones.
//   Q5_K  (256 values, 176 bytes: d, dmin, scales, 32 bytes of high bits, 128 bytes of nibbles):
//         Q4_K's formula with q = nibble | (bit j of qh[e mod 32]) << 4.
//   Q6_K  (256 values, 210 bytes: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8
//         scales, d) in 16 groups of 16: (d · scale[e / 16]) · (q − 32), q 6 bits.
// The products are in float32 in that order (no fused multiply-add: the project builds without
// -ffp-contract), so the results equal the gguf package's numpy dequantisers bit for bit.
//
// Each block is read once, front to back; the output is written in order. A model's weights are
// dequantised once at load, so these loops are plain: the time is the memory traffic.

#include "src/io/dequantize.h"

#include <cstring>
#include <iterator>
#include <string>

#include "headlight/core/error.h"
#include "src/io/half.h"

namespace headlight::io {

namespace {

constexpr int64_t kQK = 256;  // values per K-quant block

void q8_0(const uint8_t* b, float* y) {
  const float d = half_to_float(load_u16(b));
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int e = 0; e < 32; ++e) y[e] = d * static_cast<float>(q[e]);
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half_to_float(load_u16(b));
  const uint8_t* qs = b + 2;
  for (int e = 0; e < 16; ++e) {
    y[e] = d * static_cast<float>(static_cast<int>(qs[e] & 0x0F) - 8);
    y[e + 16] = d * static_cast<float>(static_cast<int>(qs[e] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
  const uint8_t* qs = b + 4;
  for (int e = 0; e < 16; ++e) {
    y[e] = d * static_cast<float>(qs[e] & 0x0F) + m;
    y[e + 16] = d * static_cast<float>(qs[e] >> 4) + m;
  }
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K block from its 12 bytes:
//   bytes 0–3: scales 0–3 (low 6 bits), the top 2 bits of scales 4–7
//   bytes 4–7: mins 0–3 (low 6 bits), the top 2 bits of mins 4–7
//   bytes 8–11: low nibbles: scales 4–7's low 4 bits; high nibbles: mins 4–7's low 4 bits
void k_scales(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3F;
    mn[j] = s[j + 4] & 0x3F;
    sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30));
    mn[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
  }
}

// Q4_K (qh == nullptr) and Q5_K.
void q45_k(const uint8_t* b, bool five, float* y) {
  const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
  uint8_t sc[8], mn[8];
  k_scales(b + 4, sc, mn);
  const uint8_t* qh = five ? b + 16 : nullptr;
  const uint8_t* qs = b + 16 + (five ? 32 : 0);
  for (int j = 0; j < 8; ++j) {
    const float dj = d * static_cast<float>(sc[j]), mj = dmin * static_cast<float>(mn[j]);
    const uint8_t* bytes = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int e = 0; e < 32; ++e) {
      int q = (bytes[e] >> shift) & 0x0F;
      if (qh) q |= ((qh[e] >> j) & 1) << 4;
      y[32 * j + e] = dj * static_cast<float>(q) - mj;
    }
  }
}

void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(load_u16(b + 208));
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128, s = (e % 128) / 64, k = e % 64, t = (e % 128) / 32, j = e % 32;
    const int lo = (ql[h * 64 + k] >> (4 * s)) & 0x0F;
    const int hi = (qh[h * 32 + j] >> (2 * t)) & 0x03;
    const int q = (lo | (hi << 4)) - 32;
    y[e] = (d * static_cast<float>(scales[e / 16])) * static_cast<float>(q);
  }
}

}  // namespace

GgmlBlock ggml_block(GgmlType type) {
  switch (type) {
    case GgmlType::f32:
      return {1, 4};
    case GgmlType::f16:
    case GgmlType::bf16:
      return {1, 2};
    case GgmlType::q8_0:
      return {32, 34};
    case GgmlType::q4_0:
      return {32, 18};
    case GgmlType::q4_1:
      return {32, 20};
    case GgmlType::q4_k:
      return {kQK, 144};
    case GgmlType::q5_k:
      return {kQK, 176};
    case GgmlType::q6_k:
      return {kQK, 210};
  }
  return {0, 0};
}

bool ggml_type_supported(uint32_t type) {
  return ggml_block(static_cast<GgmlType>(type)).values > 0;
}

void dequantize(GgmlType type, const uint8_t* src, int64_t count, float* dst) {
  const GgmlBlock blk = ggml_block(type);
  check(blk.values > 0 && count % blk.values == 0,
        "dequantize: {} values are not a whole number of {} blocks", count,
        ggml_type_name(static_cast<uint32_t>(type)));
  if (type == GgmlType::f32) {
    if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * 4);
    return;
  }
  if (type == GgmlType::f16 || type == GgmlType::bf16) {
    const bool bf16 = type == GgmlType::bf16;
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t h = load_u16(src + 2 * i);
      dst[i] = bf16 ? bf16_to_float(h) : half_to_float(h);
    }
    return;
  }
  const int64_t blocks = count / blk.values;
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * blk.bytes;
    float* y = dst + i * blk.values;
    switch (type) {
      case GgmlType::f32:
      case GgmlType::f16:
      case GgmlType::bf16:
        break;  // above
      case GgmlType::q8_0:
        q8_0(b, y);
        break;
      case GgmlType::q4_0:
        q4_0(b, y);
        break;
      case GgmlType::q4_1:
        q4_1(b, y);
        break;
      case GgmlType::q4_k:
        q45_k(b, false, y);
        break;
      case GgmlType::q5_k:
        q45_k(b, true, y);
        break;
      case GgmlType::q6_k:
        q6_k(b, y);
        break;
    }
  }
}

std::string ggml_type_name(uint32_t type) {
  static constexpr const char* kNames[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  nullptr,  nullptr, "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16",  nullptr,
      nullptr,   nullptr,  "TQ1_0",   "TQ2_0", nullptr,  nullptr, nullptr, "MXFP4"};
  if (type < std::size(kNames) && kNames[type]) return kNames[type];
  return "type " + std::to_string(type);
}

}  // namespace headlight::io

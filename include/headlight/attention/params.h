// AttentionParams: one struct that carries everything an attention kernel needs: pointers and
// strides of the operands, head counts, lengths, and every option. Kernels (the reference here, the
// fused ones later) take this struct and nothing else, so adding an option never grows an argument
// list.
//
// Semantics, for batch b, query head h, query row i and key row j (kv head g = h / (H / H_kv)):
//
//   p_i     = i                  (alignment top_left: PyTorch's is_causal)
//           = i + L_kv − L_q     (alignment bottom_right: the KV-cache convention)
//   raw_ij  = scale · q[b,h,i,:] · k[b,g,j,:]                 scale defaults to 1/√head_dim
//   s_ij    = softcap > 0 ? softcap · tanh(raw_ij / softcap) : raw_ij
//           − alibi_slope[h] · |p_i − j|                      when ALiBi slopes are given
//           + mask[b,h,i,j]                                   when the mask is additive
//   allowed = (!causal || j ≤ p_i) && (window_left < 0 || j ≥ p_i − window_left)
//             && (window_right < 0 || j ≤ p_i + window_right) && j < key_length[b]
//             && mask[b,h,i,j]                                when the mask is boolean
//   s_ij    = −inf where not allowed
//   P_ij    = softmax_j(s_ij),  lse_i = log Σ_j exp(s_ij)
//   P'_ij   = P_ij · keep_ij / (1 − dropout_p)   keep_ij = U(seed, ((b·H + h)·L_q + i)·L_kv + j) ≥
//   p out_i   = Σ_j P'_ij · v[b,g,j,:]
//
// A row with no allowed key has out = 0, lse = −inf and P = 0 (PyTorch would give NaN).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "headlight/attention/kv_layout.h"
#include "headlight/core/bf16.h"

namespace headlight::attention {

enum class Alignment : uint8_t { top_left, bottom_right };
enum class MaskKind : uint8_t { none, boolean, additive };

// A 4-D operand [batch, heads, rows, dim] of float32 (`data`) or bfloat16 (`bf16`) elements: one
// of the two pointers is set. The last dim is contiguous, the others are strided in elements (a
// stride of 0 broadcasts). Lets a packed QKV buffer, a (L, N, E) layout or a KV cache be used
// without copies.
struct Operand {
  float* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
  headlight::bf16* bf16 = nullptr;

  bool defined() const { return data != nullptr || bf16 != nullptr; }
  bool is_bf16() const { return bf16 != nullptr; }
  int64_t offset(int64_t b, int64_t h, int64_t r) const {
    return b * batch_stride + h * head_stride + r * row_stride;
  }
  float* at(int64_t b, int64_t h, int64_t r) const { return data + offset(b, h, r); }
  headlight::bf16* bf16_at(int64_t b, int64_t h, int64_t r) const { return bf16 + offset(b, h, r); }
  // Element e of row (b, h, r) as a float (exact for both types).
  float value(int64_t b, int64_t h, int64_t r, int64_t e) const {
    return bf16 ? to_float(bf16[offset(b, h, r) + e]) : data[offset(b, h, r) + e];
  }
  // Writes x there (rounded to nearest even for bf16).
  void store(int64_t b, int64_t h, int64_t r, int64_t e, float x) const {
    if (bf16)
      bf16[offset(b, h, r) + e] = to_bf16(x);
    else
      data[offset(b, h, r) + e] = x;
  }
};

// A mask [batch, heads, rows, cols] with any strides (0 broadcasts). Boolean masks are bytes,
// nonzero where attention is allowed; additive masks are floats added to the scores (−inf masks).
struct MaskOperand {
  MaskKind kind = MaskKind::none;
  const void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 1;

  // Whether a boolean mask allows (b, h, i, j); true for every other kind.
  bool allows(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (kind != MaskKind::boolean) return true;
    return static_cast<const uint8_t*>(data)[offset(b, h, i, j)] != 0;
  }
  // The value an additive mask adds at (b, h, i, j); 0 for every other kind.
  float bias(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (kind != MaskKind::additive) return 0.0f;
    return static_cast<const float*>(data)[offset(b, h, i, j)];
  }

 private:
  int64_t offset(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return b * batch_stride + h * head_stride + i * row_stride + j * col_stride;
  }
};

struct AttentionShape {
  int64_t batch = 0;
  int64_t heads = 0;     // query heads H
  int64_t kv_heads = 0;  // key/value heads H_kv, dividing H (1 = multi-query)
  int64_t len_q = 0;
  int64_t len_kv = 0;
  int64_t head_dim = 0;   // query/key dim
  int64_t value_dim = 0;  // value/output dim
};

struct AttentionOptions {
  std::optional<float> scale{};  // default 1/√head_dim
  bool causal = false;
  Alignment alignment = Alignment::top_left;  // for causal, the window and ALiBi distances
  int64_t window_left = -1;                   // < 0: unbounded
  int64_t window_right = -1;                  // < 0: unbounded
  const int64_t* key_lengths = nullptr;       // [batch], keys j ≥ key_lengths[b] are masked
  const float* alibi_slopes = nullptr;        // [heads]
  float softcap = 0.0f;                       // 0: off
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  MaskOperand mask{};
};

struct AttentionParams {
  AttentionShape shape;
  AttentionOptions options;
  // Inputs: q, k and v all float32 or all bfloat16 (products in fp32 from the bf16 values, the
  // softmax in fp32, probabilities rounded to bf16 for P·V; see docs/design.md).
  Operand q;  // [batch, heads, len_q, head_dim]
  Operand k;  // [batch, kv_heads, len_kv, head_dim]
  Operand v;  // [batch, kv_heads, len_kv, value_dim]
  // How k and v lie: rows (above), or bf16 blocked for decode (kv_layout.h).
  KvLayout kv_layout = KvLayout::rows;
  // Forward outputs.
  Operand out;             // [batch, heads, len_q, value_dim], float32 or (bf16 inputs) bfloat16
  float* lse = nullptr;    // [batch, heads, len_q] contiguous, optional
  float* probs = nullptr;  // [batch, heads, len_q, len_kv] contiguous, optional (P' after dropout)
  // Per-row statistics of P (before dropout), each optional, [batch, heads, len_q] contiguous:
  float* entropy = nullptr;     // −Σ_j P_ij log P_ij (nats); 0 for a row with no allowed key
  int64_t* argmax = nullptr;    // the key with the largest P_ij (the first on ties); −1 if none
  float* max_weight = nullptr;  // that largest P_ij; 0 for a row with no allowed key
  // Backward: the output gradient in, the input gradients out (overwritten); with bf16 inputs each
  // may be float32 or bfloat16 (the gradients are computed in fp32 and rounded once).
  Operand dout;  // [batch, heads, len_q, value_dim]
  Operand dq;    // [batch, heads, len_q, head_dim]
  Operand dk;    // [batch, kv_heads, len_kv, head_dim]
  Operand dv;    // [batch, kv_heads, len_kv, value_dim]
};

// The scale actually used.
float effective_scale(const AttentionParams& p);

// Throws headlight::Error, naming the field, when the shape or options are inconsistent (head
// counts not dividing, negative sizes, non-finite scale or softcap, dropout outside [0, 1), missing
// pointers, a blocked cache that is not bf16, has head dims not multiples of 32, or is given to a
// backward).
void validate(const AttentionParams& p, bool backward);

// p with a blocked cache (kv_layout.h) copied out into rows held by k and v (p itself, with rows,
// when it has rows already): how the calls that do not read the blocked layout take one.
AttentionParams with_row_cache(const AttentionParams& p, std::vector<headlight::bf16>& k,
                               std::vector<headlight::bf16>& v);

}  // namespace headlight::attention

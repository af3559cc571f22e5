// What MultiheadAttention::forward keeps for backward, and the row layout of its activations.
#pragma once

#include "headlight/attention/multihead_attention.h"
#include "headlight/attention/params.h"

namespace headlight::attention {

// Rows of a (L, N, ·) or (N, L, ·) activation: row(n, l) = batch_first ? n·L + l : l·N + n.
struct RowLayout {
  int64_t batch = 1;   // N
  int64_t length = 0;  // L or S
  bool batch_first = false;
  int64_t row(int64_t n, int64_t l) const { return batch_first ? n * length + l : l * batch + n; }
  int64_t batch_stride(int64_t width) const { return batch_first ? length * width : width; }
  int64_t row_stride(int64_t width) const { return batch_first ? width : batch * width; }
};

struct MultiheadAttention::Cache {
  Shape query_shape, key_shape, value_shape, output_shape;
  RowLayout q_rows, k_rows;
  int64_t kv_len = 0;      // S' = S + add_bias_kv + add_zero_attn
  Tensor x_q, x_k, x_v;    // inputs, contiguous [rows, features]
  Tensor q;                // [rows_q, E]
  Tensor k_full, v_full;   // [N, H_kv, S', d]
  Tensor heads;            // attention output before the gates [rows_q, E]
  Tensor gated;            // after the gates [rows_q, E]
  Tensor mask;             // merged additive mask, when any
  Tensor lse;              // [N, H, L] log-sum-exp of the attention, for the fused backward
  AttentionParams params;  // as run (pointers into the tensors above)
};

}  // namespace headlight::attention

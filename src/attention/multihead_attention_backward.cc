// MultiheadAttention backward: the forward of multihead_attention.cc run in reverse, llm.c style.
//
//   out = gated·W_oᵀ + b_o                 d_gated = dY·W_o,  dW_o = dYᵀ·gated,  db_o = Σ dY
//   gated_h = gate_h · heads_h             dgate_h = Σ d_gated_h ⊙ heads_h,  d_heads_h = gate_h ·
//   d_gated_h heads = attention(q, k, v)             dq, dk, dv by the attention backward k, v rows
//   S (bias_k/v), S+1 (zero)     dbias_k = Σ_n dk[n, :, S]; the zero row has no parameter q =
//   x_q·W_qᵀ + b_q (likewise k, v)     dx_q = dq·W_q,  dW_q = dqᵀ·x_q,  db_q = Σ dq

#include <cstring>

#include "headlight/attention/dispatch.h"
#include "headlight/attention/multihead_attention.h"
#include "headlight/ops/matmul.h"
#include "src/attention/multihead_attention_cache.h"

namespace headlight::attention {

MhaInputGrads MultiheadAttention::backward(ThreadContext& ctx, const TensorView& grad_output) {
  check(cache_ != nullptr, "backward: call forward first");
  Cache& k = *cache_;
  check(grad_output.dtype() == DType::f32, "grad_output: dtype must be float32, got {}",
        dtype_name(grad_output.dtype()));
  check(grad_output.shape() == k.output_shape, "grad_output: shape {} must equal the output's {}",
        shape_string(grad_output.shape()), shape_string(k.output_shape));
  const MultiheadAttentionConfig& c = config_;
  const int64_t E = c.embed_dim, H = c.num_heads, Hkv = c.num_kv_heads, d = head_dim();
  const int64_t Ekv = Hkv * d, N = k.q_rows.batch, L = k.q_rows.length, S = k.k_rows.length;
  const int64_t Sx = k.kv_len, rows_q = N * L, rows_k = N * S;
  for (auto& [name, g] : grads_) std::memset(g.data(), 0, static_cast<size_t>(g.numel()) * 4);
  Tensor dy = contiguous_copy(grad_output);

  // ---- Output projection.
  Tensor d_gated = Tensor::empty({rows_q, E});
  ops::linear_backward(ctx, {.rows = rows_q, .in_features = E, .out_features = E}, k.gated.data(),
                       E, params_.at("out_proj.weight").data(), dy.data(), E,
                       {d_gated.data(), E, grads_.at("out_proj.weight").data(),
                        c.bias ? grads_.at("out_proj.bias").data() : nullptr, false});

  // ---- Gates.
  Tensor d_heads = Tensor::empty({rows_q, E});
  gates_.zero_grads();
  gates_.backward(ctx, 0, {.rows = rows_q, .heads = H, .head_dim = d}, k.heads.data(),
                  d_gated.data(), d_heads.data());

  // ---- Attention.
  AttentionParams p = k.params;
  const RowLayout& qr = k.q_rows;
  Tensor dq = Tensor::empty({rows_q, E});
  Tensor dk_full = Tensor::empty({N, Hkv, Sx, d}), dv_full = Tensor::empty({N, Hkv, Sx, d});
  p.dout = Operand{.data = d_heads.data(),
                   .batch_stride = qr.batch_stride(E),
                   .head_stride = d,
                   .row_stride = qr.row_stride(E)};
  p.dq = Operand{.data = dq.data(),
                 .batch_stride = qr.batch_stride(E),
                 .head_stride = d,
                 .row_stride = qr.row_stride(E)};
  p.dk = Operand{
      .data = dk_full.data(), .batch_stride = Hkv * Sx * d, .head_stride = Sx * d, .row_stride = d};
  p.dv = Operand{
      .data = dv_full.data(), .batch_stride = Hkv * Sx * d, .head_stride = Sx * d, .row_stride = d};
  attention::backward(ctx, p, c.kernel);

  // ---- Unpack per-head key/value gradients into projection rows; bias_k/v get row S.
  Tensor dkp = Tensor::empty({rows_k, Ekv}), dvp = Tensor::empty({rows_k, Ekv});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < Hkv; ++g) {
      const float* kd = dk_full.data() + (n * Hkv + g) * Sx * d;
      const float* vd = dv_full.data() + (n * Hkv + g) * Sx * d;
      for (int64_t s = 0; s < S; ++s) {
        std::memcpy(dkp.data() + k.k_rows.row(n, s) * Ekv + g * d, kd + s * d, d * sizeof(float));
        std::memcpy(dvp.data() + k.k_rows.row(n, s) * Ekv + g * d, vd + s * d, d * sizeof(float));
      }
      if (c.add_bias_kv) {
        for (int64_t e = 0; e < d; ++e) {
          grads_.at("bias_k").data()[g * d + e] += kd[S * d + e];
          grads_.at("bias_v").data()[g * d + e] += vd[S * d + e];
        }
      }
    }

  // ---- Input projections.
  const bool packed = packed_in_proj();
  const float* w_q =
      packed ? params_.at("in_proj_weight").data() : params_.at("q_proj_weight").data();
  const float* w_k = packed ? w_q + E * E : params_.at("k_proj_weight").data();
  const float* w_v = packed ? w_q + (E + Ekv) * E : params_.at("v_proj_weight").data();
  float* dw_q = packed ? grads_.at("in_proj_weight").data() : grads_.at("q_proj_weight").data();
  float* dw_k = packed ? dw_q + E * E : grads_.at("k_proj_weight").data();
  float* dw_v = packed ? dw_q + (E + Ekv) * E : grads_.at("v_proj_weight").data();
  float* db_q = c.bias ? grads_.at("in_proj_bias").data() : nullptr;
  MhaInputGrads out{Tensor::empty(k.query_shape), Tensor::empty(k.key_shape),
                    Tensor::empty(k.value_shape)};
  ops::linear_backward(ctx, {.rows = rows_q, .in_features = E, .out_features = E}, k.x_q.data(), E,
                       w_q, dq.data(), E, {out.query.data(), E, dw_q, db_q, false});
  ops::linear_backward(ctx, {.rows = rows_k, .in_features = c.kdim, .out_features = Ekv},
                       k.x_k.data(), c.kdim, w_k, dkp.data(), Ekv,
                       {out.key.data(), c.kdim, dw_k, db_q ? db_q + E : nullptr, false});
  ops::linear_backward(ctx, {.rows = rows_k, .in_features = c.vdim, .out_features = Ekv},
                       k.x_v.data(), c.vdim, w_v, dvp.data(), Ekv,
                       {out.value.data(), c.vdim, dw_v, db_q ? db_q + E + Ekv : nullptr, false});
  return out;
}

}  // namespace headlight::attention

// PyTorch-semantics front end: turns TensorViews of any rank (with broadcasting, GQA and masks)
// into one AttentionParams over [batch, heads, len, dim] operands, without copying whenever the
// batch dims can be walked with a single stride, and runs the kernel.

#include "headlight/attention/sdpa.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "headlight/core/bf16.h"

namespace headlight::attention {
namespace {

// The single stride that walks the `nb` leading (batch) dims of `v` in row-major order, if any.
std::optional<int64_t> batch_stride(const TensorView& v, int64_t nb) {
  std::optional<int64_t> stride;
  int64_t expect = -1;  // the stride the next outer dim must have
  for (int64_t d = nb - 1; d >= 0; --d) {
    const int64_t size = v.shape()[d], st = v.strides()[d];
    if (size == 1) continue;
    if (!stride) {
      stride = st;
    } else if (st != expect) {
      return std::nullopt;
    }
    expect = st * size;
  }
  return stride.value_or(0);
}

// `v` has shape batch + [heads, rows, dim]; returns the 4-D operand and its flat batch count,
// copying `v` into `keep` when it cannot be described by strides.
Operand operand_of(const TensorView& v, int64_t nb, std::vector<Tensor>& keep) {
  std::optional<int64_t> bs = batch_stride(v, nb);
  if (!bs || (v.size(-1) > 1 && v.stride(-1) != 1)) {
    keep.push_back(contiguous_copy(v));
    return operand_of(keep.back().view(), nb, keep);
  }
  Operand o{.batch_stride = *bs, .head_stride = v.stride(-3), .row_stride = v.stride(-2)};
  if (v.dtype() == DType::bf16)
    o.bf16 = v.data_as<bf16>();
  else
    o.data = v.data_as<float>();
  return o;
}

std::string shapes_of(const TensorView& q, const TensorView& k, const TensorView& v) {
  return fmt::format("query {}, key {}, value {}", shape_string(q.shape()), shape_string(k.shape()),
                     shape_string(v.shape()));
}

struct Prepared {
  AttentionParams params;
  Shape batch;                // broadcast batch dims
  Shape out_shape;            // output shape as the user sees it
  int64_t kv_heads_full = 1;  // broadcast key/value heads (before MQA folding)
  std::vector<Tensor> keep;   // copies the operands point into
};

// The query and key/value head counts, after checking dtypes, ranks, dims and head counts (naming
// the argument and every shape).
std::pair<int64_t, int64_t> check_heads(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const SdpaOptions& o) {
  const char* names[3] = {"query", "key", "value"};
  const TensorView* views[3] = {&q, &k, &v};
  for (int t = 0; t < 3; ++t) {
    check(views[t]->dtype() == DType::f32 || views[t]->dtype() == DType::bf16,
          "{}: dtype must be float32 or bfloat16, got {}", names[t], dtype_name(views[t]->dtype()));
    check(views[t]->dtype() == q.dtype(),
          "{}: dtype {} differs from query's {} (query, key and value must have one dtype)",
          names[t], dtype_name(views[t]->dtype()), dtype_name(q.dtype()));
    check(views[t]->dim() >= 2, "{}: expected at least 2 dims (..., length, dim), got shape {}",
          names[t], shape_string(views[t]->shape()));
  }
  const int64_t E = q.size(-1), S = k.size(-2);
  check(k.size(-1) == E, "key: last dim {} must equal query's last dim {} ({})", k.size(-1), E,
        shapes_of(q, k, v));
  check(v.size(-2) == S, "value: length {} must equal key's length {} ({})", v.size(-2), S,
        shapes_of(q, k, v));
  auto heads = [](const TensorView& t) { return t.dim() >= 3 ? t.size(-3) : int64_t{1}; };
  const int64_t Hq = heads(q), Hk = heads(k), Hv = heads(v);
  check(Hk == Hv || (!o.enable_gqa && (Hk == 1 || Hv == 1)),
        "key/value: head counts {} and {} differ ({})", Hk, Hv, shapes_of(q, k, v));
  const int64_t Hkv = std::max(Hk, Hv);
  check(Hkv == Hq || Hkv == 1 || (o.enable_gqa && Hq % Hkv == 0),
        "key: {} heads do not match query's {} heads ({}){}", Hkv, Hq, shapes_of(q, k, v),
        o.enable_gqa ? "; with enable_gqa the key/value heads must divide the query heads"
                     : "; pass enable_gqa=True to share key/value heads among query heads");
  return {Hq, Hkv};
}

// The mask operand of attn_mask broadcast to `want` (batch..., heads, L, S); copied into `keep`
// when its batch dims cannot be one stride.
MaskOperand mask_operand(const TensorView& m, const Shape& want, int64_t nb,
                         std::vector<Tensor>& keep) {
  check(m.dtype() == DType::boolean || m.dtype() == DType::f32 || m.dtype() == DType::bf16,
        "attn_mask: dtype must be bool, float32 or bfloat16, got {}", dtype_name(m.dtype()));
  if (m.dtype() == DType::bf16) {  // added to fp32 scores: widened once (exactly)
    const Tensor packed = contiguous_copy(m);
    Tensor wide(DType::f32, packed.shape());
    to_float(packed.data<bf16>(), wide.data(), static_cast<size_t>(packed.numel()));
    keep.push_back(std::move(wide));
    return mask_operand(keep.back().view(), want, nb, keep);
  }
  check(m.dim() <= static_cast<int64_t>(want.size()),
        "attn_mask: shape {} does not broadcast to (batch..., heads, L, S) = {}",
        shape_string(m.shape()), shape_string(want));
  TensorView mb = m.broadcast_to(want, "attn_mask (must broadcast to " + shape_string(want) + ")");
  std::optional<int64_t> bs = batch_stride(mb, nb);
  if (!bs) {
    keep.push_back(contiguous_copy(mb));
    mb = keep.back().view();
    bs = batch_stride(mb, nb);
  }
  return MaskOperand{.kind = m.dtype() == DType::boolean ? MaskKind::boolean : MaskKind::additive,
                     .data = mb.data(),
                     .batch_stride = *bs,
                     .head_stride = mb.stride(-3),
                     .row_stride = mb.stride(-2),
                     .col_stride = mb.stride(-1)};
}

Prepared prepare(const TensorView& q, const TensorView& k, const TensorView& v,
                 const SdpaOptions& o) {
  Prepared r;
  const auto [Hq, Hkv] = check_heads(q, k, v, o);  // first: the sizes below need 2 dims
  const int64_t L = q.size(-2), E = q.size(-1), S = k.size(-2), Ev = v.size(-1);
  auto batch_dims = [](const TensorView& t) {
    return t.dim() > 3 ? Shape(t.shape().begin(), t.shape().end() - 3) : Shape{};
  };
  const std::string bname = "query/key/value batch dims (" + shapes_of(q, k, v) + ")";
  r.batch =
      broadcast_shapes(broadcast_shapes(batch_dims(q), batch_dims(k), bname), batch_dims(v), bname);
  const int64_t nb = static_cast<int64_t>(r.batch.size());
  checked_numel(r.batch, "batch dims");
  auto full = [&](int64_t h, int64_t len, int64_t dim) {
    Shape s = r.batch;
    s.insert(s.end(), {h, len, dim});
    return s;
  };
  const TensorView qb =
      q.with_rank(std::max<int64_t>(q.dim(), 3)).broadcast_to(full(Hq, L, E), "query");
  const TensorView kb =
      k.with_rank(std::max<int64_t>(k.dim(), 3)).broadcast_to(full(Hkv, S, E), "key");
  const TensorView vb =
      v.with_rank(std::max<int64_t>(v.dim(), 3)).broadcast_to(full(Hkv, S, Ev), "value");

  const int64_t rank = std::max({q.dim(), k.dim(), v.dim()});
  if (rank >= 3) {
    r.out_shape = r.batch;
    r.out_shape.push_back(Hq);
  }
  r.out_shape.insert(r.out_shape.end(), {L, Ev});
  checked_numel(r.out_shape, "output");
  r.kv_heads_full = Hkv;

  AttentionParams& p = r.params;
  int64_t B = 1;
  for (int64_t d : r.batch) B *= d;
  p.shape = AttentionShape{.batch = B,
                           .heads = Hq,
                           .kv_heads = Hkv,
                           .len_q = L,
                           .len_kv = S,
                           .head_dim = E,
                           .value_dim = Ev};
  p.q = operand_of(qb, nb, r.keep);
  p.k = operand_of(kb, nb, r.keep);
  p.v = operand_of(vb, nb, r.keep);
  p.options.causal = o.is_causal;
  p.options.alignment = Alignment::top_left;
  p.options.scale = o.scale;
  p.options.dropout_p = o.dropout_p;
  p.options.dropout_seed = o.dropout_seed;
  check(!o.scale || std::isfinite(*o.scale), "scale: must be finite, got {}", o.scale.value_or(0));
  check(o.dropout_p >= 0.0f && o.dropout_p < 1.0f, "dropout_p: must be in [0, 1), got {}",
        o.dropout_p);

  if (!o.attn_mask.empty_view())
    p.options.mask = mask_operand(o.attn_mask, full(Hq, L, S), nb, r.keep);
  return r;
}

}  // namespace

namespace {

// The output's shape without its last dim: the log-sum-exp's.
Shape lse_shape(const Shape& out_shape) {
  return Shape(out_shape.begin(), out_shape.end() - 1);
}

Tensor run_forward(ThreadContext& ctx, const TensorView& query, const TensorView& key,
                   const TensorView& value, const SdpaOptions& options, Tensor* lse,
                   Tensor* probs) {
  Prepared r = prepare(query, key, value, options);
  if (lse) {
    *lse = Tensor(DType::f32, lse_shape(r.out_shape));  // [B, H, L] row-major
    r.params.lse = lse->data();
  }
  if (probs) {
    Shape shape = lse_shape(r.out_shape);  // [B, H, L, S] row-major
    shape.push_back(r.params.shape.len_kv);
    checked_numel(shape, "probs");
    *probs = Tensor(DType::f32, shape);
    r.params.probs = probs->data();
  }
  Tensor out(query.dtype(), r.out_shape);  // PyTorch's: the inputs' dtype
  const AttentionShape& s = r.params.shape;
  r.params.out = Operand{.batch_stride = s.heads * s.len_q * s.value_dim,
                         .head_stride = s.len_q * s.value_dim,
                         .row_stride = s.value_dim};
  if (out.dtype() == DType::bf16)
    r.params.out.bf16 = out.data<bf16>();
  else
    r.params.out.data = out.data();
  forward(ctx, r.params, options.kernel);
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(ThreadContext& ctx, const TensorView& query,
                                    const TensorView& key, const TensorView& value,
                                    const SdpaOptions& options) {
  return run_forward(ctx, query, key, value, options, nullptr, nullptr);
}

SdpaOutput scaled_dot_product_attention_with_lse(ThreadContext& ctx, const TensorView& query,
                                                 const TensorView& key, const TensorView& value,
                                                 const SdpaOptions& options, bool probs) {
  SdpaOutput r;
  r.output = run_forward(ctx, query, key, value, options, &r.lse, probs ? &r.probs : nullptr);
  return r;
}

SdpaGrads scaled_dot_product_attention_backward(ThreadContext& ctx, const TensorView& query,
                                                const TensorView& key, const TensorView& value,
                                                const TensorView& grad_output,
                                                const SdpaOptions& options,
                                                const SdpaSaved& saved) {
  Prepared r = prepare(query, key, value, options);
  check(grad_output.dtype() == query.dtype(), "grad_output: dtype must be the query's {}, got {}",
        dtype_name(query.dtype()), dtype_name(grad_output.dtype()));
  check(grad_output.shape() == r.out_shape, "grad_output: expected the output's shape {}, got {}",
        shape_string(r.out_shape), shape_string(grad_output.shape()));
  const AttentionShape& s = r.params.shape;
  const int64_t nb = static_cast<int64_t>(r.batch.size());
  r.params.dout = operand_of(grad_output.with_rank(nb + 3), nb, r.keep);
  check(saved.output.empty_view() == saved.lse.empty_view(),
        "saved: the forward's output and lse go together (got only the {})",
        saved.lse.empty_view() ? "output" : "lse");
  if (!saved.output.empty_view()) {
    check(saved.output.dtype() == query.dtype() && saved.output.shape() == r.out_shape,
          "saved output: expected {} {}, got {} {}", dtype_name(query.dtype()),
          shape_string(r.out_shape), dtype_name(saved.output.dtype()),
          shape_string(saved.output.shape()));
    check(saved.lse.dtype() == DType::f32 && saved.lse.shape() == lse_shape(r.out_shape),
          "saved lse: expected float32 {}, got {} {}", shape_string(lse_shape(r.out_shape)),
          dtype_name(saved.lse.dtype()), shape_string(saved.lse.shape()));
    r.params.out = operand_of(saved.output.with_rank(nb + 3), nb, r.keep);
    if (saved.lse.is_contiguous()) {
      r.params.lse = saved.lse.data_as<float>();
    } else {
      r.keep.push_back(contiguous_copy(saved.lse));
      r.params.lse = r.keep.back().data();
    }
  }

  auto full = [&](int64_t h, int64_t len, int64_t dim) {
    Shape sh = r.batch;
    sh.insert(sh.end(), {h, len, dim});
    return sh;
  };
  // A gradient with its input's own elements (no broadcast dim expanded: the same count, so the
  // same order) is written by the kernel in place, in the input's dtype; one of a broadcast input
  // is accumulated in fp32 over the full shape, summed down, then (bf16) rounded once.
  struct Grad {
    Tensor t;
    bool direct;
  };
  auto grad_for = [&](const TensorView& input, const Shape& shape) {
    const bool direct = checked_numel(shape, "gradient") == input.numel();
    return Grad{Tensor(direct ? query.dtype() : DType::f32, direct ? input.shape() : shape),
                direct};
  };
  auto operand = [](Grad& g, const Shape& shape) {  // shape: batch + [heads, rows, width]
    const int64_t n = static_cast<int64_t>(shape.size());
    Operand o{.batch_stride = shape[n - 3] * shape[n - 2] * shape[n - 1],
              .head_stride = shape[n - 2] * shape[n - 1],
              .row_stride = shape[n - 1]};
    if (g.t.dtype() == DType::bf16)
      o.bf16 = g.t.data<bf16>();
    else
      o.data = g.t.data();
    return o;
  };
  const Shape q_full = full(s.heads, s.len_q, s.head_dim);
  const Shape k_full = full(s.kv_heads, s.len_kv, s.head_dim);
  const Shape v_full = full(s.kv_heads, s.len_kv, s.value_dim);
  Grad dq = grad_for(query, q_full), dk = grad_for(key, k_full), dv = grad_for(value, v_full);
  r.params.dq = operand(dq, q_full);
  r.params.dk = operand(dk, k_full);
  r.params.dv = operand(dv, v_full);
  backward(ctx, r.params, options.kernel);
  auto finish = [&](Grad& g, const TensorView& input) {
    if (g.direct) return std::move(g.t);
    Tensor summed = sum_to_shape(g.t, input.shape());
    if (query.dtype() != DType::bf16) return summed;
    Tensor out(DType::bf16, summed.shape());
    to_bf16(summed.data(), out.data<bf16>(), static_cast<size_t>(summed.numel()));
    return out;
  };
  return SdpaGrads{finish(dq, query), finish(dk, key), finish(dv, value)};
}

}  // namespace headlight::attention

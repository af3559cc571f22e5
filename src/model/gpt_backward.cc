// GPT backward: the forward's steps in reverse, each layer's gradient beside gpt_forward.cc's
// forward. Parameter gradients are added (+=) into the gradient arena; activation gradients are
// scratch buffers of the state.
//
// Per block (pre-norm), with dy the gradient of the block's output:
//   dh = dy;  MLP: dgel = dy'·W_proj, dfc = act'(fc)·dgel, dh += ln_2ᵀ(dfc·W_fc)
//   attention: dattg = dh'·W_o, datt = gate·dattg, dgate += Σ dattg·att, dqkv from the fused
//   backward (RoPE undone on dq, dk), dx = dh + ln_1ᵀ(dqkv·W_qkv)
// (dy' = dropout of dy with the forward's mask; ln_1ᵀ is the norm's backward.)

#include <algorithm>
#include <cstring>

#include "headlight/core/bf16.h"
#include "headlight/core/error.h"
#include "headlight/ops/layers.h"
#include "headlight/ops/matmul.h"
#include "src/model/gpt_blocks.h"

namespace headlight::model {

using detail::Dims;

namespace {

// base + offset, or null when the offset is −1 (an absent parameter) or base is null (no weight
// gradients wanted).
float* maybe(float* base, int64_t offset) {
  return base && offset >= 0 ? base + offset : nullptr;
}

// bf16 products (GPT::set_dtype): the bf16 copy of the parameter arena P, and scratch for the
// rounded operands. P16 null: float32 products.
struct Bf16Products {
  const float* P = nullptr;
  const bf16* P16 = nullptr;
  Tensor* dy16 = nullptr;
  Tensor* dfc16 = nullptr;
  Tensor* datt16 = nullptr;
  Tensor* x16 = nullptr;
  const GPT::State* state = nullptr;  // the forward's rounded inputs (State::rounded)
};

// Room for n bf16 values in scratch (grown as needed).
bf16* room(Tensor& scratch, int64_t n) {
  if (scratch.numel() < n) scratch = Tensor(DType::bf16, {n});
  return scratch.data<bf16>();
}

// `n` elements of x rounded to bf16 into scratch, in parallel.
const bf16* rounded(ThreadContext& ctx, const float* x, int64_t n, Tensor& scratch) {
  bf16* out = room(scratch, n);
  to_bf16(ctx, x, out, n);
  return out;
}

// dy [rows, cols] rounded to bf16 for the products (into b16.dy16), and its column sums added to
// db in the same pass when db is given.
const bf16* rounded_grad(ThreadContext& ctx, int64_t rows, int64_t cols, const float* dy, float* db,
                         const Bf16Products& b16) {
  bf16* dy16 = room(*b16.dy16, rows * cols);
  if (db)
    ops::round_with_column_sums(ctx, rows, cols, dy, dy16, db);
  else
    to_bf16(ctx, dy, dy16, rows * cols);
  return dy16;
}

// The products of linear_grads with bf16 operands, dy already rounded (dy16): dx overwritten (or
// added when accumulate_dx), or with dx16 written only rounded to bf16 there (multiplied first by
// dx_multiply [rows, in] when given, in the product's epilogue); dW added (not computed when dw is
// null); x as the forward rounded it.
void products_bf16(ThreadContext& ctx, const ops::LinearShape& s, const float* x, const float* w,
                   const bf16* dy16, float* dx, bool accumulate_dx, float* dw,
                   const Bf16Products& b16, bf16* dx16 = nullptr,
                   const float* dx_multiply = nullptr) {
  const int64_t rows = s.rows, in = s.in_features, out = s.out_features;
  const bf16* w16 = b16.P16 + (w - b16.P);
  if (dx || dx16)
    ops::matmul(ctx, {.rows = rows, .cols = out, .ld = out, .bf16 = dy16},
                {.rows = out, .cols = in, .ld = in, .bf16 = w16},
                {.data = dx16 ? nullptr : dx,
                 .ld = in,
                 .alpha = 1.0f,
                 .beta = accumulate_dx ? 1.0f : 0.0f,
                 .data16 = dx16,
                 .multiply = dx_multiply,
                 .multiply_ld = in});
  if (dw) {
    const bf16* x16 = nullptr;  // as the forward rounded it, else rounded now
    for (size_t i = 0; i < b16.state->rounded_used && !x16; ++i) {
      const GPT::State::Rounded& r = b16.state->rounded[i];
      if (r.src == x && r.n == rows * in) x16 = r.values.data<bf16>();
    }
    if (!x16) x16 = rounded(ctx, x, rows * in, *b16.x16);
    ops::matmul(ctx, {.rows = out, .cols = rows, .ld = out, .transposed = true, .bf16 = dy16},
                {.rows = rows, .cols = in, .ld = in, .bf16 = x16},
                {.data = dw, .ld = in, .alpha = 1.0f, .beta = 1.0f});
  }
}

// Gradients of y = x·Wᵀ + b: dx overwritten (or added when accumulate_dx), dW and db added (not
// computed when dw is null). With bf16 products, dy, x and W enter the products rounded to bf16
// (fp32 accumulation into the float32 gradients), db sums the float32 dy, and with dx16 dx is
// written only rounded, there.
void linear_grads(ThreadContext& ctx, const ops::LinearShape& s, const float* x, const float* w,
                  const float* dy, float* dx, bool accumulate_dx, float* dw, float* db,
                  const Bf16Products& b16 = {}, bf16* dx16 = nullptr) {
  if (b16.P16) {
    if (s.rows == 0 || s.out_features == 0) return;
    const bf16* dy16 = rounded_grad(ctx, s.rows, s.out_features, dy, dw ? db : nullptr, b16);
    products_bf16(ctx, s, x, w, dy16, dx, accumulate_dx, dw, b16, dx16);
    return;
  }
  if (dx)
    ops::linear_backward(ctx, s, x, s.in_features, w, dy, s.out_features,
                         {dx, s.in_features, nullptr, nullptr, accumulate_dx});
  if (dw)
    ops::linear_backward(ctx, s, x, s.in_features, w, dy, s.out_features,
                         {nullptr, 0, dw, db, true});
}

}  // namespace

void GPT::backward(ThreadContext& ctx, const int32_t* tokens, const float* doutput,
                   const ForwardOptions& options) {
  State& s = *state_;
  check(!s.inference,
        "backward: the last forward was for inference (ForwardOptions::inference or decoding) and "
        "kept no activations");
  check(!s.micro_batch,
        "backward: the last forward_backward ran in micro-batches (ForwardOptions::micro_batches) "
        "and kept no whole batch's activations; run forward() first");
  backward_into(ctx, s, grads(), tokens, doutput, options);
}

void GPT::backward_into(ThreadContext& ctx, State& s, float* G, const int32_t* tokens,
                        const float* doutput, const ForwardOptions& options) {
  const GPTConfig& c = config_;
  const Dims d = detail::dims(c, s.batch, s.seq);
  const ModelOffsets off = model_offsets(c, layout_);
  const float* P = params_.data();
  const Bf16Products b16{.P = P,
                         .P16 = dtype_ == DType::bf16 ? params16(ctx) : nullptr,
                         .dy16 = &s.dy16,
                         .dfc16 = &s.dfc16,
                         .datt16 = &s.datt16,
                         .x16 = &s.x16,
                         .state = &s};
  // The weights' gradients go to G, or are not computed (the gates' alone: head importance).
  float* GW = options.weight_grads ? G : nullptr;
  const bool drop = options.train && c.dropout > 0.0f;
  const ops::NormKind nk =
      c.norm == Norm::layernorm ? ops::NormKind::layer_norm : ops::NormKind::rms_norm;
  const ops::NormShape ns{.kind = nk, .rows = d.rows, .cols = d.C, .eps = c.norm_eps};
  const int64_t n = d.rows * d.C;

  float* dx = s.dx.get(n);      // gradient of the residual stream at the current point
  float* dres = s.dres.get(n);  // gradient of a residual branch's output
  float* da = s.da.get(n);
  float* dfc = s.dfc.get(d.rows * d.Fi);
  float* dgel = s.dgel.get(d.rows * d.F);
  float* datt = s.datt.get(d.rows * c.n_head * d.hd);  // room for the widest layer
  float* dqkv = s.dqkv.get(d.rows * (c.n_head + 2 * c.n_kv_head) * d.hd);

  // Logits (or the hidden states handed out) and the final norm.
  const float* final_in = c.norm_first ? s.lnf.ptr() : s.x[static_cast<size_t>(c.n_layer)].ptr();
  float* dfinal = c.norm_first ? da : dx;
  if (c.lm_head)
    linear_grads(ctx, {.rows = d.rows, .in_features = d.C, .out_features = d.V}, final_in,
                 P + off.lm_head, doutput, dfinal, false, maybe(GW, off.lm_head), nullptr, b16);
  else
    std::memcpy(dfinal, doutput, sizeof(float) * static_cast<size_t>(n));
  if (c.norm_first)
    ops::norm_backward(ctx, ns, s.x[static_cast<size_t>(c.n_layer)].ptr(), P + off.lnf_w,
                       s.lnf_mean.ptr(), s.lnf_rstd.ptr(), da,
                       {dx, false, G + off.lnf_w, maybe(G, off.lnf_b)});

  for (int64_t l = c.n_layer - 1; l >= 0; --l) {
    const Dims d = detail::dims(c, s.batch, s.seq, l);  // this layer's head counts
    BlockActivations& a = s.blocks[static_cast<size_t>(l)];
    const BlockOffsets& o = off.blocks[static_cast<size_t>(l)];
    const float* x = s.x[static_cast<size_t>(l)].ptr();
    const uint64_t stream = 1 + 2 * static_cast<uint64_t>(l);

    // MLP branch. After it, dx holds the gradient at h (pre-norm: the residual after attention;
    // post-norm: the sum x + attn(x) before ln_1).
    const float* m_in = c.norm_first ? a.ln2.ptr() : a.ln1.ptr();
    if (!c.norm_first) {
      // out = ln_2(h2), h2 = m_in + branch: dres = ln_2ᵀ(dx) is the gradient at h2.
      ops::norm_backward(ctx, ns, a.h2.ptr(), P + o.ln2_w, a.ln2_mean.ptr(), a.ln2_rstd.ptr(), dx,
                         {dres, false, G + o.ln2_w, maybe(G, o.ln2_b)});
      std::memcpy(dx, dres, sizeof(float) * static_cast<size_t>(n));  // gradient at m_in so far
    } else if (drop) {
      std::memcpy(dres, dx, sizeof(float) * static_cast<size_t>(n));
    }
    // The branch output's gradient: dx itself, unless dropout scales a copy (post-norm: dres).
    if (drop) detail::dropout(ctx, dres, n, c.dropout, options.seed, stream + 1);
    const float* dmlp = drop || !c.norm_first ? dres : dx;
    const ops::LinearShape down{.rows = d.rows, .in_features = d.F, .out_features = d.C};
    const ops::ActivationShape as{.kind = c.activation, .rows = d.rows, .width = d.F};
    const ops::LinearShape up{.rows = d.rows, .in_features = d.C, .out_features = d.Fi};
    if (b16.P16 && ops::activation_keeps_grad(c.activation)) {
      // Mixed precision: dfc = act'(fc) ⊙ (dmlp · W_proj) only rounded to bf16, straight from the
      // product's epilogue (the forward left act'(fc) in a.fc); fc's bias gradient summed from
      // those bf16 values. Then the gradient at m_in: da = dfc · W_fc.
      const bf16* dmlp16 = rounded_grad(ctx, d.rows, d.C, dmlp, maybe(GW, o.fc_proj_b), b16);
      bf16* dfc16 = room(*b16.dfc16, d.rows * d.Fi);
      products_bf16(ctx, down, a.gel.ptr(), P + o.fc_proj_w, dmlp16, nullptr, false,
                    maybe(GW, o.fc_proj_w), b16, dfc16, a.fc.ptr());
      if (GW && o.fc_b >= 0) ops::add_column_sums(ctx, d.rows, d.Fi, dfc16, GW + o.fc_b);
      products_bf16(ctx, up, m_in, P + o.fc_w, dfc16, da, false, maybe(GW, o.fc_w), b16);
    } else {
      // dfc = act'(fc) ⊙ (dmlp · W_proj)
      linear_grads(ctx, down, a.gel.ptr(), P + o.fc_proj_w, dmlp, dgel, false,
                   maybe(GW, o.fc_proj_w), maybe(GW, o.fc_proj_b), b16);
      if (ops::activation_keeps_grad(c.activation))  // the forward left act'(fc) in a.fc
        ops::activation_backward_from_grad(ctx, as, a.fc.ptr(), dgel, dfc);
      else
        ops::activation_backward(ctx, as, a.fc.ptr(), dgel, dfc);
      // Gradient at m_in: da = dfc · W_fc.
      linear_grads(ctx, up, m_in, P + o.fc_w, dfc, da, false, maybe(GW, o.fc_w), maybe(GW, o.fc_b),
                   b16);
    }
    if (c.norm_first) {
      ops::norm_backward(ctx, ns, a.h.ptr(), P + o.ln2_w, a.ln2_mean.ptr(), a.ln2_rstd.ptr(), da,
                         {dx, true, G + o.ln2_w, maybe(G, o.ln2_b)});
    } else {
      detail::add(ctx, n, da, dx, da);  // m_in = ln_1(h) feeds both paths
      ops::norm_backward(ctx, ns, a.h.ptr(), P + o.ln1_w, a.ln1_mean.ptr(), a.ln1_rstd.ptr(), da,
                         {dx, false, G + o.ln1_w, maybe(G, o.ln1_b)});
    }

    // Attention branch: h = x + branch; its output's gradient is dx (with dropout, a scaled copy).
    if (drop) {
      std::memcpy(dres, dx, sizeof(float) * static_cast<size_t>(n));
      detail::dropout(ctx, dres, n, c.dropout, options.seed, stream);
    }
    float* dattg = datt;
    // Mixed precision with bf16 attention and no gates to weigh it: the attention's output
    // gradient comes out of the product only rounded (the attention backward reads dO in bf16).
    bf16* datt16 = b16.P16 && s.attended_bf16 && !a.gated && !options.gate_grads
                       ? room(*b16.datt16, d.rows * d.H * d.hd)
                       : nullptr;
    linear_grads(ctx, {.rows = d.rows, .in_features = d.H * d.hd, .out_features = d.C},
                 a.gated ? a.attg.ptr() : a.att.ptr(), P + o.proj_w, drop ? dres : dx, dattg, false,
                 maybe(GW, o.proj_w), maybe(GW, o.proj_b), b16, datt16);
    // Gates: dgate_h += Σ dattg_h · att_h; datt_h = gate_h · dattg_h (in place; the identity when
    // every gate of the layer is 1, so then only for the gates' gradients).
    if (a.gated || options.gate_grads)
      gates_.backward(ctx, l, {.rows = d.rows, .heads = d.H, .head_dim = d.hd}, a.att.ptr(), dattg,
                      dattg);
    // Mixed precision without RoPE (which turns dq and dk in float32): the attention backward
    // writes dq, dk and dv only rounded to bf16, where the q/k/v product reads them, and the bias
    // gradient is summed from those values; no float32 dqkv is written or read.
    bf16* dqkv16 = b16.P16 && s.attended_bf16 && c.positional != Positional::rope
                       ? room(*b16.dy16, d.rows * d.W)
                       : nullptr;
    for (size_t i = 0; i < s.segments.size(); ++i) {
      const Segment& g = s.segments[i];
      attention::AttentionParams p =
          detail::segment_attention(c, d, g, l, a.qkv.ptr(), a.att.ptr(), a.lse.ptr(), s);
      if (s.attended_bf16)  // the forward attended qkv rounded to bf16 (qkv may be unwritten)
        detail::to_bf16_operands(a.qkv.ptr(), s.blocks[static_cast<size_t>(l)].qkv16.data<bf16>(),
                                 p);
      if (drop) {
        p.options.dropout_p = c.dropout;
        p.options.dropout_seed = detail::attention_dropout_seed(options.seed, l, i);
      }
      detail::set_attention_grads(detail::dims(c, g.batch, g.len, l), datt + g.row0 * d.H * d.hd,
                                  dqkv + g.row0 * d.W, p);
      if (dqkv16) detail::point_at_bf16(dqkv, dqkv16, {&p.dq, &p.dk, &p.dv});
      if (datt16) detail::point_at_bf16(datt, datt16, {&p.dout});
      detail::layer_attention(ctx, c, l, p, options.kernel, true);
      if (c.positional == Positional::rope) {
        float* dq = dqkv + g.row0 * d.W;
        apply_rope(s.rope, {g.batch * g.len, g.len, 0, d.W, d.H, true}, dq);
        apply_rope(s.rope, {g.batch * g.len, g.len, 0, d.W, d.G, true}, dq + d.H * d.hd);
      }
    }
    const float* a_in = c.norm_first ? a.ln1.ptr() : x;
    const ops::LinearShape qkv_shape{.rows = d.rows, .in_features = d.C, .out_features = d.W};
    // The gradient at a_in, dqkv · W_qkv: pre-norm into da, then through ln_1 into dx; post-norm
    // added to dx.
    float* d_in = c.norm_first ? da : dx;
    if (dqkv16) {
      if (GW && o.attn_b >= 0) ops::add_column_sums(ctx, d.rows, d.W, dqkv16, GW + o.attn_b);
      products_bf16(ctx, qkv_shape, a_in, P + o.attn_w, dqkv16, d_in, !c.norm_first,
                    maybe(GW, o.attn_w), b16);
    } else {
      linear_grads(ctx, qkv_shape, a_in, P + o.attn_w, dqkv, d_in, !c.norm_first,
                   maybe(GW, o.attn_w), maybe(GW, o.attn_b), b16);
    }
    if (c.norm_first)
      ops::norm_backward(ctx, ns, x, P + o.ln1_w, a.ln1_mean.ptr(), a.ln1_rstd.ptr(), da,
                         {dx, true, G + o.ln1_w, maybe(G, o.ln1_b)});
  }

  if (drop) detail::dropout(ctx, dx, n, c.dropout, options.seed, 0);
  float* demb = dx;  // gradient of the summed embeddings
  if (c.embedding_norm) {
    ops::norm_backward(ctx, ns, s.emb.ptr(), P + off.lne_w, s.lne_mean.ptr(), s.lne_rstd.ptr(), dx,
                       {da, false, G + off.lne_w, maybe(G, off.lne_b)});
    demb = da;
  }
  const int64_t* positions = s.positions.empty() ? nullptr : s.positions.data();
  if (!options.weight_grads) return;
  ops::embedding_backward(
      ctx, {.rows = d.rows, .dim = d.C, .vocab = d.V, .period = d.T, .positions = positions},
      tokens, demb, G + off.wte, c.positional == Positional::learned ? G + off.wpe : nullptr);
  if (c.type_vocab_size > 0)
    ops::embedding_backward(ctx, {d.rows, d.C, c.type_vocab_size, d.T}, s.types.data(), demb,
                            G + off.wtt, nullptr);
}

}  // namespace headlight::model

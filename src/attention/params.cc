#include "headlight/attention/params.h"

#include <cmath>

#include "headlight/core/error.h"

namespace headlight::attention {

float effective_scale(const AttentionParams& p) {
  if (p.options.scale) return *p.options.scale;
  return p.shape.head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(p.shape.head_dim)) : 1.0f;
}

void validate(const AttentionParams& p, bool backward) {
  const AttentionShape& s = p.shape;
  check(s.batch >= 0 && s.heads >= 0 && s.kv_heads >= 0 && s.len_q >= 0 && s.len_kv >= 0 &&
            s.head_dim >= 0 && s.value_dim >= 0,
        "attention: negative size in shape (batch {}, heads {}, kv_heads {}, len_q {}, len_kv {}, "
        "head_dim {}, value_dim {})",
        s.batch, s.heads, s.kv_heads, s.len_q, s.len_kv, s.head_dim, s.value_dim);
  check(s.heads == 0 || (s.kv_heads > 0 && s.heads % s.kv_heads == 0),
        "attention: kv_heads ({}) must divide heads ({})", s.kv_heads, s.heads);
  const AttentionOptions& o = p.options;
  check(!o.scale || std::isfinite(*o.scale), "attention: scale must be finite, got {}",
        o.scale ? *o.scale : 0.0f);
  check(std::isfinite(o.softcap) && o.softcap >= 0,
        "attention: softcap must be finite and >= 0, got {}", o.softcap);
  check(o.dropout_p >= 0.0f && o.dropout_p < 1.0f, "attention: dropout_p must be in [0, 1), got {}",
        o.dropout_p);
  check(o.mask.kind == MaskKind::none || o.mask.data != nullptr,
        "attention: mask kind is set but the mask pointer is null");
  const bool work = s.batch > 0 && s.heads > 0 && s.len_q > 0;
  if (!work) return;
  check(p.q.defined() && (backward || p.out.defined()),
        "attention: query and output pointers are required");
  check(s.len_kv == 0 || (p.k.defined() && p.v.defined()),
        "attention: key and value pointers are required");
  for (const Operand* x : {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv})
    check(!(x->data && x->bf16), "attention: an operand has both a float32 and a bf16 pointer");
  const bool bf16 = p.q.is_bf16();
  check(s.len_kv == 0 || (p.k.is_bf16() == bf16 && p.v.is_bf16() == bf16),
        "attention: q, k and v must have one dtype (q is {}, k {}, v {})", bf16 ? "bf16" : "f32",
        p.k.is_bf16() ? "bf16" : "f32", p.v.is_bf16() ? "bf16" : "f32");
  check(bf16 || !p.out.is_bf16(), "attention: a bf16 output needs bf16 inputs");
  if (p.kv_layout == KvLayout::blocked && s.len_kv > 0) {
    check(bf16, "attention: kv_layout blocked needs a bf16 cache (q, k and v bf16)");
    check(s.head_dim % 32 == 0 && s.value_dim % 32 == 0 && s.head_dim > 0 && s.value_dim > 0,
          "attention: kv_layout blocked needs head_dim and value_dim multiples of 32 (got {} and "
          "{})",
          s.head_dim, s.value_dim);
    check(!backward,
          "attention backward: kv_layout blocked is a decode cache; give k and v as rows");
    // Each (batch, kv head) region holds the whole capacity (a stride of 0 shares one).
    const int64_t rk = blocked_region_elements(s.len_kv, s.head_dim);
    const int64_t rv = blocked_region_elements(s.len_kv, s.value_dim);
    auto fits = [](int64_t stride, int64_t region) { return stride == 0 || stride >= region; };
    check(fits(p.k.head_stride, rk) && fits(p.k.batch_stride, rk) && fits(p.v.head_stride, rv) &&
              fits(p.v.batch_stride, rv),
          "attention: kv_layout blocked needs k and v head and batch strides of 0 or at least "
          "blocked_region_elements ({} for k, {} for v; k has {} and {}, v {} and {})",
          rk, rv, p.k.head_stride, p.k.batch_stride, p.v.head_stride, p.v.batch_stride);
  }
  if (backward) {
    for (const Operand* x : {&p.dout, &p.dq, &p.dk, &p.dv})
      check(bf16 || !x->is_bf16(), "attention backward: bf16 gradients need bf16 inputs");
    check(p.dout.defined() && p.dq.defined(),
          "attention backward: dout and dq pointers are required");
    check(s.len_kv == 0 || (p.dk.defined() && p.dv.defined()),
          "attention backward: dk and dv pointers are required");
  }
}

}  // namespace headlight::attention

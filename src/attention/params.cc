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
  check(p.q.data && (backward || p.out.data), "attention: query and output pointers are required");
  check(s.len_kv == 0 || (p.k.data && p.v.data), "attention: key and value pointers are required");
  if (backward) {
    check(p.dout.data && p.dq.data, "attention backward: dout and dq pointers are required");
    check(s.len_kv == 0 || (p.dk.data && p.dv.data),
          "attention backward: dk and dv pointers are required");
  }
}

}  // namespace headlight::attention

#include "headlight/attention/kv_layout.h"

#include <algorithm>
#include <vector>

#include "headlight/attention/params.h"
#include "headlight/core/error.h"

namespace headlight::attention {
namespace {

// Value slabs: 64 pair words wide, or 32 when the value dim is an odd multiple of 32.
int64_t slab_width(int64_t dim) {
  return dim % 64 == 0 ? 64 : 32;
}

}  // namespace

int64_t blocked_capacity(int64_t keys) {
  return (std::max<int64_t>(keys, 0) + kBlockedChunk - 1) / kBlockedChunk * kBlockedChunk;
}

int64_t blocked_region_elements(int64_t keys, int64_t dim) {
  return blocked_capacity(keys) * dim;
}

int64_t blocked_key_index(int64_t j, int64_t e, int64_t dim) {
  const int64_t word =
      ((j / kBlockedKeyGroup) * (dim / 2) + e / 2) * kBlockedKeyGroup + j % kBlockedKeyGroup;
  return word * 2 + e % 2;
}

int64_t blocked_value_index(int64_t j, int64_t d, int64_t dim) {
  const int64_t w = slab_width(dim), jj = j % kBlockedChunk;
  const int64_t word =
      (((j / kBlockedChunk) * (dim / w) + d / w) * (kBlockedChunk / 2) + jj / 2) * w + d % w;
  return word * 2 + jj % 2;
}

void write_blocked_rows(KvSide side, const bf16* src, int64_t ld, int64_t first, int64_t n,
                        int64_t dim, bf16* dst) {
  check(dim > 0 && dim % 32 == 0,
        "write_blocked_rows: dim must be a positive multiple of 32, got {}", dim);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t j = first + r;
    const bf16* row = src + r * ld;
    for (int64_t e = 0; e < dim; ++e)
      dst[side == KvSide::keys ? blocked_key_index(j, e, dim) : blocked_value_index(j, e, dim)] =
          row[e];
  }
}

void read_blocked_rows(KvSide side, const bf16* src, int64_t first, int64_t n, int64_t dim,
                       bf16* dst, int64_t ld) {
  check(dim > 0 && dim % 32 == 0,
        "read_blocked_rows: dim must be a positive multiple of 32, got {}", dim);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t j = first + r;
    bf16* row = dst + r * ld;
    for (int64_t e = 0; e < dim; ++e)
      row[e] =
          src[side == KvSide::keys ? blocked_key_index(j, e, dim) : blocked_value_index(j, e, dim)];
  }
}

AttentionParams with_row_cache(const AttentionParams& p, std::vector<bf16>& k,
                               std::vector<bf16>& v) {
  AttentionParams rows = p;
  rows.kv_layout = KvLayout::rows;
  if (p.kv_layout == KvLayout::rows) return rows;
  const AttentionShape& s = p.shape;
  const int64_t B = s.batch, G = s.kv_heads, S = s.len_kv, D = s.head_dim, Dv = s.value_dim;
  k.assign(static_cast<size_t>(B * G * S * D), bf16{});
  v.assign(static_cast<size_t>(B * G * S * Dv), bf16{});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      read_blocked_rows(KvSide::keys, p.k.bf16_at(b, g, 0), 0, S, D, k.data() + (b * G + g) * S * D,
                        D);
      read_blocked_rows(KvSide::values, p.v.bf16_at(b, g, 0), 0, S, Dv,
                        v.data() + (b * G + g) * S * Dv, Dv);
    }
  rows.k =
      Operand{.batch_stride = G * S * D, .head_stride = S * D, .row_stride = D, .bf16 = k.data()};
  rows.v = Operand{
      .batch_stride = G * S * Dv, .head_stride = S * Dv, .row_stride = Dv, .bf16 = v.data()};
  return rows;
}

}  // namespace headlight::attention

// How a bf16 key/value cache lies in memory (AttentionParams::kv_layout).
//
// rows (the default): K [batch, kv_heads, len_kv, head_dim] and V [..., value_dim] with any
// strides, each key's row contiguous, as PyTorch and the models keep them.
//
// blocked: a layout for decode, the one kind of call that reads a whole cache for a few query
// rows. Read in rows, decode spends about as many instructions on rearranging as on products:
// each query row · key row dot product ends in a horizontal sum, and P·V must interleave two
// value rows into the pairs `vdpbf16ps` multiplies. Blocked, neither is needed:
//
//   keys: groups of 16 keys, each [head_dim / 2 pairs][16 keys] of 32-bit pair words:
//         word (p, c) = (k[c][2p], k[c][2p + 1]). One 64-byte line holds one pair of 16 keys, so
//         a broadcast query pair times that line is 16 scores' worth of products.
//   values: chunks of 256 keys, each [value_dim / w slabs][128 key pairs][w] pair words, with
//         slabs w = 64 wide (32 when value_dim is an odd multiple of 32): word (s, c2, d) =
//         (v[2·c2][s·w + d], v[2·c2 + 1][s·w + d]). One line is 16 outputs of a key pair, read in
//         address order slab by slab.
//
// Each (batch, kv head) owns a region of blocked_capacity(keys) · dim elements, located by the
// operand's batch_stride and head_stride (row_stride is not used). head_dim and value_dim must be
// multiples of 32, and the operands bf16. A key's place is blocked_key_index / blocked_value_index;
// write_blocked_rows fills a region from rows (a prefill, or one step's new keys) and
// read_blocked_rows copies rows back out. Entries past the last key may hold anything: the kernels
// never let them reach an output.
//
// The fused forward reads a blocked cache in place for decode on AVX-512 BF16 (the plan's
// native decode); every other call and CPU, and the reference, read it through a row copy.
// The backward does not take it (a cache is not trained).
#pragma once

#include <cstdint>

#include "headlight/core/bf16.h"

namespace headlight::attention {

enum class KvLayout : uint8_t { rows, blocked };

// Keys per key group and per value chunk of the blocked layout.
constexpr int64_t kBlockedKeyGroup = 16;
constexpr int64_t kBlockedChunk = 256;

// Keys a blocked region holds room for: `keys` rounded up to a whole chunk.
int64_t blocked_capacity(int64_t keys);
// Elements of one (batch, kv head) region for `keys` keys of `dim` elements.
int64_t blocked_region_elements(int64_t keys, int64_t dim);
// Where element e of key j lies in a blocked key region (head dim `dim`), in elements.
int64_t blocked_key_index(int64_t j, int64_t e, int64_t dim);
// Where element d of value row j lies in a blocked value region (value dim `dim`), in elements.
int64_t blocked_value_index(int64_t j, int64_t d, int64_t dim);

// Which of a cache's two operands a region holds.
enum class KvSide : uint8_t { keys, values };

// Copies rows [first, first + n) of one head (row r at src + (r − first) · ld, `dim` elements)
// into the blocked region `dst`. The caller keeps dst's capacity above first + n.
void write_blocked_rows(KvSide side, const bf16* src, int64_t ld, int64_t first, int64_t n,
                        int64_t dim, bf16* dst);
// Copies rows [first, first + n) of the blocked region `src` out as rows (row r at
// dst + (r − first) · ld).
void read_blocked_rows(KvSide side, const bf16* src, int64_t first, int64_t n, int64_t dim,
                       bf16* dst, int64_t ld);

}  // namespace headlight::attention

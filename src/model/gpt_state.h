// The GPT's working memory: activations saved by the forward for the backward, their gradients,
// the KV cache and the positional tables. Buffers only grow, so repeated steps touch no fresh
// pages.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/tensor.h"
#include "headlight/model/config.h"
#include "headlight/model/gpt.h"
#include "headlight/model/parameters.h"
#include "headlight/model/positional.h"

namespace headlight::model {

// A float (or bf16) buffer, 64-byte aligned like every Tensor, that keeps its memory when asked
// for less. Growing keeps the contents and zeroes the new part.
template <class T>
struct BasicBuffer {
  Tensor data;
  T* get(int64_t n) {
    if (data.numel() < n) {
      Tensor grown = Tensor::zeros(std::is_same_v<T, bf16> ? DType::bf16 : DType::f32, {n});
      if (data.numel() > 0)
        std::memcpy(grown.data<T>(), data.data<T>(), sizeof(T) * static_cast<size_t>(data.numel()));
      data = std::move(grown);
    }
    return data.data<T>();
  }
  T* ptr() { return data.data<T>(); }
};
using Buffer = BasicBuffer<float>;

// Saved by the forward for one block, rows = B·T.
struct BlockActivations {
  // [rows, C], [rows], [rows]; pre-norm with bf16 products, ln1 (and ln2) is never written: it
  // names its rows' rounded copy (State::rounded), which the norm writes directly.
  Buffer ln1, ln1_mean, ln1_rstd;
  Buffer qkv;                      // [rows, (H + 2G)·hd], q and k after RoPE
  Tensor qkv16;                    // bf16 products (not decoding): qkv rounded, for attention
  Buffer att;                      // [rows, H·hd] attention output before the gates
  Buffer attg;                     // [rows, H·hd] after the gates (c_proj's input)
  bool gated = true;               // false: every gate was 1, c_proj's input was att itself
  Buffer lse;                      // [B, H, T]
  Buffer h;                        // [rows, C] x + attn (pre-norm: the residual after attention)
  Buffer ln2, ln2_mean, ln2_rstd;  // [rows, C], [rows], [rows]
  Buffer fc, gel;                  // [rows, Fi] before and [rows, F] after the activation
  Buffer h2;                       // [rows, C] post-norm only: h + mlp before ln_2
};

// Rows that attend among themselves: `batch` sequences of `len` rows from row `row0` (one
// segment for a [B, T] batch; one per sequence for packed sequences).
struct Segment {
  int64_t row0 = 0, batch = 0, len = 0;
};

struct GPT::State {
  int64_t batch = 0, seq = 0;     // shape of the last forward
  std::vector<Segment> segments;  // of the last forward
  bool inference = false;         // the last forward kept no activations for a backward
  bool cached = false;            // the last forward was decoding (its rows attended the cache)
  // The last forward_backward ran in micro-batches: this state holds the first one's activations.
  bool micro_batch = false;
  // The last forward attended qkv rounded to bf16 (blocks[l].qkv16; then blocks[l].qkv may be
  // unwritten: see GPT::run).
  bool attended_bf16 = false;
  std::vector<int64_t> positions;  // [rows] packed sequences: each row's position
  std::vector<Buffer> x;           // [n_layer + 1] residual stream, [rows, C] each (inference:
                                   // x[0], then x[1] and x[2] in turn)
  Buffer emb, lne_mean, lne_rstd;  // embedding_norm: the summed embeddings before ln_e, its stats
  std::vector<int32_t> types;      // [rows] token types of the last forward (type_vocab_size > 0)
  std::vector<BlockActivations> blocks;  // an inference forward uses blocks[0] for every layer
                                         // but each layer's own qkv
  Buffer lnf, lnf_mean, lnf_rstd;        // final norm (pre-norm only)
  Buffer logits;                         // [rows, V] (with an LM head)
  Tensor x16;                            // bf16 products: a product's input rows, rounded
  Tensor dy16;                           // bf16 products, backward: an output gradient, rounded
  Tensor dfc16;   // mixed precision, backward: the MLP's up-projection output gradient, rounded
  Tensor datt16;  // mixed precision, backward: the attention's output gradient, rounded
  // bf16 products in a forward for a backward: each product's input as rounded then ([n] bf16,
  // from `src`), so that the backward's weight gradients reuse it; `rounded_used` of them are this
  // forward's (the tensors stay, to be reused by the next).
  struct Rounded {
    const float* src = nullptr;
    int64_t n = 0;
    Tensor values;
  };
  std::vector<Rounded> rounded;
  size_t rounded_used = 0;
  // Gradients of activations (backward scratch).
  Buffer dlogits, dx, dres, da, dfc, dgel, datt, dqkv;
  std::vector<float> sinusoidal;  // [block_size, C]
  RopeTable rope;
  std::vector<float> alibi;  // [n_head]
  // KV cache: per layer [n_kv_head, capacity, hd] keys and values (after RoPE; capacity positions
  // per head, doubling as the cache grows: detail::use_cache); in bf16 when the products are
  // (set_dtype), then blocked for decode when hd is a multiple of 32 (attention/kv_layout.h),
  // else float32.
  std::vector<Buffer> cache_k, cache_v;
  std::vector<BasicBuffer<bf16>> cache_k16, cache_v16;
  int64_t cache_len = 0;
};

}  // namespace headlight::model

// Dense matrix products through oneDNN, and the linear layer built on them.
//
// All matrices are row-major with a leading dimension (the distance between rows, in elements):
// float32, or both inputs bf16 (products of the bf16 values accumulated in fp32 into a float32
// output; oneDNN runs them on AMX tiles or AVX-512 BF16 where the CPU has them). oneDNN runs on
// OpenMP; the number of threads comes from the ThreadContext.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"
#include "headlight/ops/layers.h"

namespace headlight::ops {

// A linear layer's bf16 weight W [out, in], copied once into the blocked layout oneDNN's bf16
// matrix product reads directly. Given a plain (row-major) weight, oneDNN copies it into that
// layout inside every product, which for one input row (decoding a token) costs more than the
// product itself: Zen 4, 2 threads, one row against W 1,536 × 576 took 48 µs plain and 13 µs
// packed, and against SmolLM2's 49,152 × 576 LM head 3.5 ms and 1.9 ms (its bytes at 29 GB/s, the
// machine's read bandwidth). For inference, where the weights stay fixed across calls.
class PackedWeightStore;

class PackedWeight {
 public:
  PackedWeight();
  // W [out_features, in_features], row-major bf16; the copy is the same values. With a store,
  // the copy lies in the store's memory (which must outlive it); without, oneDNN allocates it.
  PackedWeight(const bf16* weight, int64_t in_features, int64_t out_features,
               PackedWeightStore* store = nullptr);
  PackedWeight(PackedWeight&&) noexcept;
  PackedWeight& operator=(PackedWeight&&) noexcept;
  ~PackedWeight();

  bool empty() const { return impl_ == nullptr; }
  // Whether a product of `rows` input rows should read this copy: oneDNN picks the layout per
  // row count, and the copy has the layout of one row (decoding). Where many rows (512) get the
  // same layout (AVX-512 BF16) it serves every product; where they do not (AMX may block
  // differently), products of more than kPackedRows rows are better off with the plain weight.
  bool serves(int64_t rows) const;
  static constexpr int64_t kPackedRows = 16;
  int64_t in_features() const;
  int64_t out_features() const;
  // Bytes of the packed copy.
  size_t bytes() const;

  struct Impl;  // oneDNN's memory and its layout (matmul.cc)
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Memory for a model's packed weights: chunks of at least kChunkBytes, each a Tensor (so on 2 MiB
// pages where the system gives them), the copies one after the other, 64-byte aligned. Decoding a
// token streams every weight once: SmolLM2-135M in bf16 (270 MB of weights in 120 copies of
// 0.66–3.5 MB and a 57 MB LM head), Zen 4, 2 threads, 400 greedy tokens: 82–88 tokens/s from the
// store against 71–78 with oneDNN's own 4 KB-page buffers, both with the model's fp32 arena on
// 2 MiB pages (docs/notes/2026-12-07-huge-pages-and-decode-rows.md). clear() drops every chunk:
// drop the weights packed into them first.
class PackedWeightStore {
 public:
  static constexpr size_t kChunkBytes = size_t{64} << 20;
  // `bytes` of the store's memory, 64-byte aligned, for as long as the store is not cleared.
  std::byte* take(size_t bytes);
  void clear();
  // Bytes of all chunks (taken or not).
  size_t reserved() const;

 private:
  std::vector<Tensor> chunks_;
  size_t used_ = 0;  // bytes taken from chunks_.back()
};

// A row-major matrix operand, optionally used transposed. With transposed = false it is
// rows × cols with element (r, c) at data[r * ld + c]; with transposed = true the stored matrix is
// cols × rows and the product uses its transpose.
struct MatrixArg {
  const float* data = nullptr;
  int64_t rows = 0;  // rows of the operand as used in the product
  int64_t cols = 0;  // columns of the operand as used in the product
  int64_t ld = 0;    // leading dimension of the stored matrix
  bool transposed = false;
  const headlight::bf16* bf16 = nullptr;  // instead of data: bf16 elements (both inputs then)
  // The right-hand operand only, instead of data and bf16: a packed weight W [out, in] used as Wᵀ
  // (rows = in, cols = out; a's elements bf16).
  const PackedWeight* packed = nullptr;
};

struct OutputArg {
  float* data = nullptr;
  int64_t ld = 0;
  float alpha = 1.0f;  // c = alpha * a·b + beta * c
  float beta = 0.0f;
  const float* bias = nullptr;  // [b.cols] added to every row (with beta = 0 only)
  // Applied to every element last, in the product's epilogue (an element-wise kind; with beta = 0
  // only).
  std::optional<Activation> activation{};
  // When set, c is written here rounded to bf16 (round to nearest even, after the bias, the
  // activation and the multiplication) instead of into data; beta must be 0.
  headlight::bf16* data16 = nullptr;
  // When set, c is multiplied element by element by m [a.rows, b.cols] (float32, rows
  // multiply_ld apart) in the product's epilogue, after the bias and the activation (beta = 0
  // only): mixed-precision training's dfc = (dy·W) ⊙ act'(fc) rounded once, with no float32 pass
  // over the product between.
  const float* multiply = nullptr;
  int64_t multiply_ld = 0;
};

// c[a.rows, b.cols] = alpha · a[a.rows, a.cols] · b[b.rows, b.cols] + beta · c (+ bias).
void matmul(ThreadContext& ctx, const MatrixArg& a, const MatrixArg& b, const OutputArg& c);

// Shapes of a linear layer applied to `rows` input rows: y[rows, out] = x[rows, in] · Wᵀ + bias,
// with W stored [out, in] as nn.Linear stores it.
struct LinearShape {
  int64_t rows = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

// y[rows, out] (leading dim ldy) = x[rows, in] (leading dim ldx) · W[out, in]ᵀ + bias[out].
// bias may be null. With `activation` (an element-wise kind), y = act(x · Wᵀ + bias) in one pass
// (oneDNN's epilogue; no pre-activation values are kept, so only where no backward follows).
void linear_forward(ThreadContext& ctx, const LinearShape& s, const float* x, int64_t ldx,
                    const float* weight, const float* bias, float* y, int64_t ldy,
                    std::optional<Activation> activation = std::nullopt);

// linear_forward with bf16 inputs and weight (products accumulated in fp32, float32 output).
void linear_forward_bf16(ThreadContext& ctx, const LinearShape& s, const bf16* x, int64_t ldx,
                         const bf16* weight, const float* bias, float* y, int64_t ldy,
                         std::optional<Activation> activation = std::nullopt);

// linear_forward_bf16 with the packed weight (the same values, so the same result).
void linear_forward_bf16(ThreadContext& ctx, const LinearShape& s, const bf16* x, int64_t ldx,
                         const PackedWeight& weight, const float* bias, float* y, int64_t ldy,
                         std::optional<Activation> activation = std::nullopt);

// linear_forward_bf16 with y written rounded to bf16 (y16, leading dim ldy): the product's own
// epilogue rounds it, so no float32 y is written or read.
void linear_forward_bf16_rounded(ThreadContext& ctx, const LinearShape& s, const bf16* x,
                                 int64_t ldx, const bf16* weight, const float* bias, bf16* y16,
                                 int64_t ldy);
void linear_forward_bf16_rounded(ThreadContext& ctx, const LinearShape& s, const bf16* x,
                                 int64_t ldx, const PackedWeight& weight, const float* bias,
                                 bf16* y16, int64_t ldy);

// Gradients of linear_forward given dy[rows, out] (leading dim ldy). Each output pointer may be
// null to skip it; results are accumulated (+=) when `accumulate` is true, else overwritten.
//   dx[rows, in] = dy · W          dW[out, in] = dyᵀ · x          dbias[out] = Σ_rows dy
struct LinearGrads {
  float* dx = nullptr;
  int64_t lddx = 0;
  float* dweight = nullptr;
  float* dbias = nullptr;
  bool accumulate = false;
};
void linear_backward(ThreadContext& ctx, const LinearShape& s, const float* x, int64_t ldx,
                     const float* weight, const float* dy, int64_t ldy, const LinearGrads& grads);

}  // namespace headlight::ops

// Norms, GELU, embeddings and cross-entropy (see headlight/ops/layers.h). Rows run in parallel;
// sums over rows go through fixed chunks (kChunkRows) added in order, so that the result is the
// same for any thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/ops/layers.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "src/ops/layers-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headlight {
namespace HWY_NAMESPACE {

void GeluForwardDispatch(const float* x, float* y, int64_t n) {
  GeluForward<GeluTanhForm>(x, y, n);
}
void GeluBackwardDispatch(const float* x, const float* dy, float* dx, int64_t n) {
  GeluBackward<GeluTanhForm>(x, dy, dx, n);
}
void GeluErfForwardDispatch(const float* x, float* y, int64_t n) {
  GeluForward<GeluErfForm>(x, y, n);
}
void GeluErfBackwardDispatch(const float* x, const float* dy, float* dx, int64_t n) {
  GeluBackward<GeluErfForm>(x, dy, dx, n);
}
void GeluForwardKeepingGradDispatch(float* x_then_grad, float* y, int64_t n) {
  GeluForwardKeepingGrad<GeluTanhForm>(x_then_grad, y, n);
}
void GeluErfForwardKeepingGradDispatch(float* x_then_grad, float* y, int64_t n) {
  GeluForwardKeepingGrad<GeluErfForm>(x_then_grad, y, n);
}
void MulElementsDispatch(const float* g, const float* dy, float* dx, int64_t n) {
  MulElements(g, dy, dx, n);
}
void SwigluForwardDispatch(const float* gate, const float* up, float* y, int64_t n) {
  SwigluForward(gate, up, y, n);
}
void SwigluBackwardDispatch(const float* gate, const float* up, const float* dy, float* dgate,
                            float* dup, int64_t n) {
  SwigluBackward(gate, up, dy, dgate, dup, n);
}
float RowLogSumExpDispatch(const float* x, int64_t n, float* p) {
  return RowLogSumExp(x, n, p);
}
float NormRowDispatch(const float* x, const float* w, const float* b, float* y, int64_t n,
                      bool center, float eps, float* mean) {
  return NormRow(x, w, b, y, n, center, eps, mean);
}
void NormRowBackwardDispatch(const float* x, const float* w, const float* dy, float mean,
                             float rstd, int64_t n, bool center, float* dx, bool accumulate,
                             float* pw, float* pb) {
  NormRowBackward(x, w, dy, mean, rstd, n, center, dx, accumulate, pw, pb);
}

void AddColumnSumsDispatch(const float* x, int64_t ldx, int64_t rows, int64_t cols, double* sums) {
  AddColumnSums(x, ldx, rows, cols, sums);
}
void AddColumnSumsBf16Dispatch(const bf16* x, int64_t ldx, int64_t rows, int64_t cols,
                               double* sums) {
  AddColumnSums(x, ldx, rows, cols, sums);
}

}  // namespace HWY_NAMESPACE
}  // namespace headlight
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <cmath>
#include <cstring>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/error.h"
#include "headlight/ops/layers.h"

namespace headlight {

HWY_EXPORT(GeluForwardDispatch);
HWY_EXPORT(GeluBackwardDispatch);
HWY_EXPORT(GeluErfForwardDispatch);
HWY_EXPORT(GeluErfBackwardDispatch);
HWY_EXPORT(GeluForwardKeepingGradDispatch);
HWY_EXPORT(GeluErfForwardKeepingGradDispatch);
HWY_EXPORT(MulElementsDispatch);
HWY_EXPORT(SwigluForwardDispatch);
HWY_EXPORT(SwigluBackwardDispatch);
HWY_EXPORT(RowLogSumExpDispatch);
HWY_EXPORT(NormRowDispatch);
HWY_EXPORT(AddColumnSumsDispatch);
HWY_EXPORT(AddColumnSumsBf16Dispatch);
HWY_EXPORT(NormRowBackwardDispatch);

namespace ops {

void add_column_sums(const float* x, int64_t ldx, int64_t rows, int64_t cols, double* sums) {
  HWY_DYNAMIC_DISPATCH(AddColumnSumsDispatch)(x, ldx, rows, cols, sums);
}

namespace {

constexpr int64_t kChunkRows = 32;       // rows per partial sum of a reduction over rows
constexpr int64_t kElementBlock = 4096;  // elements per parallel item of an activation

int64_t chunks(int64_t rows) {
  return (rows + kChunkRows - 1) / kChunkRows;
}

// Adds partial[nchunks, cols] in chunk order into out[cols] (the sums in T, float or double).
template <class T>
void add_partials(ThreadContext& ctx, const T* partial, int64_t nchunks, int64_t cols, float* out) {
  ctx.parallel_for(cols, [&](Range r, int) {
    for (int64_t c = r.begin; c < r.end; ++c) {
      T acc = 0;
      for (int64_t k = 0; k < nchunks; ++k) acc += partial[k * cols + c];
      out[c] += static_cast<float>(acc);
    }
  });
}

// A GELU kind's value into y and, in place of x, its derivative (activation_keeps_grad kinds).
void keep_grad_run(Activation kind, float* x_then_grad, float* y, int64_t n) {
  if (kind == Activation::gelu_tanh)
    HWY_DYNAMIC_DISPATCH(GeluForwardKeepingGradDispatch)(x_then_grad, y, n);
  else
    HWY_DYNAMIC_DISPATCH(GeluErfForwardKeepingGradDispatch)(x_then_grad, y, n);
}

}  // namespace

void norm_forward(ThreadContext& ctx, const NormShape& s, const float* x, const float* weight,
                  const float* bias, float* y, float* mean, float* rstd) {
  const bool center = s.kind == NormKind::layer_norm;
  ctx.parallel_for(s.rows, [&](Range range, int) {
    for (int64_t r = range.begin; r < range.end; ++r) {
      float m;
      rstd[r] = HWY_DYNAMIC_DISPATCH(NormRowDispatch)(x + r * s.cols, weight, bias, y + r * s.cols,
                                                      s.cols, center, s.eps, &m);
      if (mean) mean[r] = m;
    }
  });
}

void norm_forward_bf16(ThreadContext& ctx, const NormShape& s, const float* x, const float* weight,
                       const float* bias, bf16* y, float* mean, float* rstd) {
  const bool center = s.kind == NormKind::layer_norm;
  ctx.parallel_for(s.rows, [&](Range range, int worker) {
    float* row = ctx.scratch(worker).floats(static_cast<size_t>(s.cols));  // [cols], in L1
    for (int64_t r = range.begin; r < range.end; ++r) {
      float m;
      rstd[r] = HWY_DYNAMIC_DISPATCH(NormRowDispatch)(x + r * s.cols, weight, bias, row, s.cols,
                                                      center, s.eps, &m);
      if (mean) mean[r] = m;
      to_bf16(row, y + r * s.cols, static_cast<size_t>(s.cols));
    }
  });
}

void norm_backward(ThreadContext& ctx, const NormShape& s, const float* x, const float* weight,
                   const float* mean, const float* rstd, const float* dy, const NormGrads& g) {
  const bool center = s.kind == NormKind::layer_norm;
  const int64_t n = chunks(s.rows);
  const bool params = g.dweight || g.dbias;
  // partial[2, nchunks, cols]: dweight then dbias sums of each chunk of rows.
  float* partial =
      params ? ctx.shared_scratch().floats(static_cast<size_t>(2 * n * s.cols)) : nullptr;
  ctx.parallel_items(n, [&](int64_t chunk, int) {
    float* pw = params ? partial + chunk * s.cols : nullptr;
    float* pb = params ? partial + (n + chunk) * s.cols : nullptr;
    if (params) {
      std::memset(pw, 0, sizeof(float) * static_cast<size_t>(s.cols));
      std::memset(pb, 0, sizeof(float) * static_cast<size_t>(s.cols));
    }
    const int64_t end = std::min(s.rows, (chunk + 1) * kChunkRows);
    for (int64_t r = chunk * kChunkRows; r < end; ++r) HWY_DYNAMIC_DISPATCH(NormRowBackwardDispatch)
    (x + r * s.cols, weight, dy + r * s.cols, center ? mean[r] : 0.0f, rstd[r], s.cols, center,
     g.dx ? g.dx + r * s.cols : nullptr, g.accumulate, pw, pb);
  });
  if (g.dweight) add_partials(ctx, partial, n, s.cols, g.dweight);
  if (g.dbias) add_partials(ctx, partial + n * s.cols, n, s.cols, g.dbias);
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::gelu_erf:
      return "gelu";
    case Activation::relu:
      return "relu";
    case Activation::swiglu:
      return "swiglu";
  }
  return "?";
}

Activation parse_activation(const std::string& name) {
  for (Activation a :
       {Activation::gelu_tanh, Activation::gelu_erf, Activation::relu, Activation::swiglu})
    if (name == activation_name(a)) return a;
  fail("activation: expected gelu_tanh, gelu, relu or swiglu, got \"{}\"", name);
}

void activation_forward(ThreadContext& ctx, const ActivationShape& s, const float* in, float* out) {
  const int64_t F = s.width;
  if (s.kind == Activation::swiglu) {
    ctx.parallel_for(s.rows, [&](Range r, int) {
      for (int64_t i = r.begin; i < r.end; ++i) HWY_DYNAMIC_DISPATCH(SwigluForwardDispatch)
      (in + i * 2 * F, in + i * 2 * F + F, out + i * F, F);
    });
    return;
  }
  const int64_t n = s.rows * F;
  ctx.parallel_items((n + kElementBlock - 1) / kElementBlock, [&](int64_t b, int) {
    const int64_t begin = b * kElementBlock, len = std::min(kElementBlock, n - begin);
    switch (s.kind) {
      case Activation::gelu_tanh:
        HWY_DYNAMIC_DISPATCH(GeluForwardDispatch)(in + begin, out + begin, len);
        break;
      case Activation::gelu_erf:
        HWY_DYNAMIC_DISPATCH(GeluErfForwardDispatch)(in + begin, out + begin, len);
        break;
      default:
        for (int64_t i = begin; i < begin + len; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
    }
  });
}

bool activation_keeps_grad(Activation kind) {
  return kind == Activation::gelu_tanh || kind == Activation::gelu_erf;
}

void activation_forward_keeping_grad(ThreadContext& ctx, const ActivationShape& s,
                                     float* in_then_grad, float* out) {
  check(activation_keeps_grad(s.kind), "activation_forward_keeping_grad: {} keeps no derivative",
        activation_name(s.kind));
  const int64_t n = s.rows * s.width;
  ctx.parallel_items((n + kElementBlock - 1) / kElementBlock, [&](int64_t b, int) {
    const int64_t begin = b * kElementBlock, len = std::min(kElementBlock, n - begin);
    keep_grad_run(s.kind, in_then_grad + begin, out + begin, len);
  });
}

void activation_backward_from_grad(ThreadContext& ctx, const ActivationShape& s, const float* grad,
                                   const float* dout, float* din) {
  check(activation_keeps_grad(s.kind), "activation_backward_from_grad: {} keeps no derivative",
        activation_name(s.kind));
  const int64_t n = s.rows * s.width;
  ctx.parallel_items((n + kElementBlock - 1) / kElementBlock, [&](int64_t b, int) {
    const int64_t begin = b * kElementBlock, len = std::min(kElementBlock, n - begin);
    HWY_DYNAMIC_DISPATCH(MulElementsDispatch)(grad + begin, dout + begin, din + begin, len);
  });
}

void activation_forward_keeping_grad_bf16(ThreadContext& ctx, const ActivationShape& s,
                                          float* in_then_grad, bf16* out) {
  check(activation_keeps_grad(s.kind),
        "activation_forward_keeping_grad_bf16: {} keeps no derivative", activation_name(s.kind));
  const int64_t n = s.rows * s.width;
  ctx.parallel_items((n + kElementBlock - 1) / kElementBlock, [&](int64_t b, int) {
    // The values in pieces of an L1 buffer (whole vectors, so that every element takes the path
    // it takes in activation_forward_keeping_grad), then rounded.
    constexpr int64_t kPiece = 1024;
    alignas(64) float values[kPiece];
    const int64_t end = std::min(n, (b + 1) * kElementBlock);
    for (int64_t begin = b * kElementBlock; begin < end; begin += kPiece) {
      const int64_t len = std::min(kPiece, end - begin);
      keep_grad_run(s.kind, in_then_grad + begin, values, len);
      to_bf16(values, out + begin, static_cast<size_t>(len));
    }
  });
}

namespace {

// dbias[j] += the column sums of a [rows, cols] matrix: each fixed chunk of rows summed in double
// by sum_chunk(r0, len, sums) into its own partial, the partials added in chunk order (the same
// bits for any thread count).
template <class SumChunk>
void chunked_column_sums(ThreadContext& ctx, int64_t rows, int64_t cols, float* dbias,
                         SumChunk&& sum_chunk) {
  const int64_t n = chunks(rows);
  // partial[n, cols] doubles, in the shared scratch (two floats each, 64-byte aligned).
  auto* partial =
      reinterpret_cast<double*>(ctx.shared_scratch().floats(static_cast<size_t>(2 * n * cols)));
  ctx.parallel_items(n, [&](int64_t chunk, int) {
    const int64_t r0 = chunk * kChunkRows, len = std::min(kChunkRows, rows - r0);
    double* sums = partial + chunk * cols;
    std::fill(sums, sums + cols, 0.0);
    sum_chunk(r0, len, sums);
  });
  add_partials(ctx, partial, n, cols, dbias);
}

}  // namespace

void round_with_column_sums(ThreadContext& ctx, int64_t rows, int64_t cols, const float* x, bf16* y,
                            float* dbias) {
  chunked_column_sums(ctx, rows, cols, dbias, [&](int64_t r0, int64_t len, double* sums) {
    add_column_sums(x + r0 * cols, cols, len, cols, sums);  // the chunk's rows are still in L1/L2
    to_bf16(x + r0 * cols, y + r0 * cols, static_cast<size_t>(len * cols));
  });
}

void add_column_sums(ThreadContext& ctx, int64_t rows, int64_t cols, const bf16* x, float* dbias) {
  chunked_column_sums(ctx, rows, cols, dbias, [&](int64_t r0, int64_t len, double* sums) {
    HWY_DYNAMIC_DISPATCH(AddColumnSumsBf16Dispatch)(x + r0 * cols, cols, len, cols, sums);
  });
}

void activation_backward(ThreadContext& ctx, const ActivationShape& s, const float* in,
                         const float* dout, float* din) {
  const int64_t F = s.width;
  if (s.kind == Activation::swiglu) {
    ctx.parallel_for(s.rows, [&](Range r, int) {
      for (int64_t i = r.begin; i < r.end; ++i) HWY_DYNAMIC_DISPATCH(SwigluBackwardDispatch)
      (in + i * 2 * F, in + i * 2 * F + F, dout + i * F, din + i * 2 * F, din + i * 2 * F + F, F);
    });
    return;
  }
  const int64_t n = s.rows * F;
  ctx.parallel_items((n + kElementBlock - 1) / kElementBlock, [&](int64_t b, int) {
    const int64_t begin = b * kElementBlock, len = std::min(kElementBlock, n - begin);
    switch (s.kind) {
      case Activation::gelu_tanh:
        HWY_DYNAMIC_DISPATCH(GeluBackwardDispatch)(in + begin, dout + begin, din + begin, len);
        break;
      case Activation::gelu_erf:
        HWY_DYNAMIC_DISPATCH(GeluErfBackwardDispatch)(in + begin, dout + begin, din + begin, len);
        break;
      default:
        for (int64_t i = begin; i < begin + len; ++i) din[i] = in[i] > 0.0f ? dout[i] : 0.0f;
    }
  });
}

void embedding_forward(ThreadContext& ctx, const EmbeddingShape& s, const int32_t* tokens,
                       const float* wte, const float* pos, float* x) {
  for (int64_t r = 0; r < s.rows; ++r)
    check(tokens[r] >= 0 && tokens[r] < s.vocab,
          "tokens: id {} at position {} is outside the vocabulary [0, {})", tokens[r], r, s.vocab);
  ctx.parallel_for(s.rows, [&](Range range, int) {
    for (int64_t r = range.begin; r < range.end; ++r) {
      const float* e = wte + static_cast<int64_t>(tokens[r]) * s.dim;
      const int64_t at = s.positions ? s.positions[r] : r % s.period;
      const float* p = pos ? pos + at * s.dim : nullptr;
      float* xr = x + r * s.dim;
      for (int64_t c = 0; c < s.dim; ++c) xr[c] = e[c] + (p ? p[c] : 0.0f);
    }
  });
}

void embedding_backward(ThreadContext& ctx, const EmbeddingShape& s, const int32_t* tokens,
                        const float* dx, float* dwte, float* dpos) {
  // Split over embedding columns: each worker adds every row in order into its columns.
  ctx.parallel_for(s.dim, [&](Range cols, int) {
    for (int64_t r = 0; r < s.rows; ++r) {
      const float* d = dx + r * s.dim;
      float* e = dwte + static_cast<int64_t>(tokens[r]) * s.dim;
      for (int64_t c = cols.begin; c < cols.end; ++c) e[c] += d[c];
      if (dpos) {
        float* p = dpos + (s.positions ? s.positions[r] : r % s.period) * s.dim;
        for (int64_t c = cols.begin; c < cols.end; ++c) p[c] += d[c];
      }
    }
  });
}

int64_t counted_targets(int64_t rows, int64_t vocab, const int32_t* targets) {
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    check(targets[r] >= -1 && targets[r] < vocab,
          "targets: id {} at position {} is outside [0, {}) (−1 ignores a position)", targets[r], r,
          vocab);
    counted += targets[r] >= 0;
  }
  return counted;
}

double cross_entropy(ThreadContext& ctx, const CrossEntropyShape& s, const float* logits,
                     const int32_t* targets, float* dlogits) {
  check(s.counted >= 0, "cross_entropy: counted must be ≥ 0, got {}", s.counted);
  const int64_t here = counted_targets(s.rows, s.vocab, targets);
  check(s.counted == 0 || s.counted >= here,
        "cross_entropy: counted ({}) is fewer than the {} targets counted here", s.counted, here);
  const int64_t counted = s.counted > 0 ? s.counted : here;
  const float inv = counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f;
  const int64_t n = chunks(s.rows);
  std::vector<double> partial(static_cast<size_t>(n), 0.0);
  ctx.parallel_items(n, [&](int64_t chunk, int) {
    const int64_t end = std::min(s.rows, (chunk + 1) * kChunkRows);
    double acc = 0.0;
    for (int64_t r = chunk * kChunkRows; r < end; ++r) {
      const float* row = logits + r * s.vocab;
      float* drow = dlogits ? dlogits + r * s.vocab : nullptr;
      const int32_t t = targets[r];
      if (t < 0) {
        if (drow) std::memset(drow, 0, sizeof(float) * static_cast<size_t>(s.vocab));
        continue;
      }
      const float lse = HWY_DYNAMIC_DISPATCH(RowLogSumExpDispatch)(row, s.vocab, drow);
      acc += static_cast<double>(lse) - row[t];
      if (drow) {
        for (int64_t c = 0; c < s.vocab; ++c) drow[c] *= inv;
        drow[t] -= inv;
      }
    }
    partial[static_cast<size_t>(chunk)] = acc;
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return counted > 0 ? total / static_cast<double>(counted) : 0.0;
}

}  // namespace ops
}  // namespace headlight

#endif  // HWY_ONCE

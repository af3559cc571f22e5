// The per-row layers of a transformer block besides attention and the products: layer and RMS
// normalisation, the activations (GELU, ReLU, SwiGLU), token/position embeddings and the
// cross-entropy loss, each with its backward beside it (llm.c style). Plain row-major float32
// arrays with explicit sizes.
//
// Determinism: reductions over rows (the gradients of norm weights, of embeddings, the loss) are
// summed in fixed chunks of rows in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <string>

#include "headlight/core/bf16.h"
#include "headlight/core/thread_context.h"

namespace headlight::ops {

enum class NormKind : uint8_t { layer_norm, rms_norm };

// x[rows, cols] normalised per row:
//   layer_norm: y = (x − mean) · rstd · weight + bias,  rstd = 1/√(var + eps) (biased variance)
//   rms_norm:   y = x · rstd · weight,                 rstd = 1/√(mean(x²) + eps)
// bias may be null (no bias); mean is unused (may be null) for rms_norm.
struct NormShape {
  NormKind kind = NormKind::layer_norm;
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-5f;
};

// y[rows, cols]; saves mean[rows] (layer norm) and rstd[rows] for the backward.
void norm_forward(ThreadContext& ctx, const NormShape& s, const float* x, const float* weight,
                  const float* bias, float* y, float* mean, float* rstd);
// norm_forward whose output is written only rounded to bf16 (the bits of to_bf16 applied to
// norm_forward's y): for an output that only feeds bf16 products, without writing and reading
// back the float32 rows.
void norm_forward_bf16(ThreadContext& ctx, const NormShape& s, const float* x, const float* weight,
                       const float* bias, bf16* y, float* mean, float* rstd);

// dx[rows, cols] (+= when accumulate), dweight[cols] += , dbias[cols] += (null to skip).
struct NormGrads {
  float* dx = nullptr;
  bool accumulate = false;
  float* dweight = nullptr;
  float* dbias = nullptr;
};
void norm_backward(ThreadContext& ctx, const NormShape& s, const float* x, const float* weight,
                   const float* mean, const float* rstd, const float* dy, const NormGrads& g);

// The MLP's activations, over rows of width F (the MLP's hidden width):
//   gelu_tanh: GPT-2's ½x(1 + tanh(√(2/π)(x + 0.044715x³)))   ("gelu_new" in transformers)
//   gelu_erf:  the exact ½x(1 + erf(x/√2))                     (BERT's "gelu")
//   relu:      max(x, 0)
//   swiglu:    silu(gate)·up on rows [gate (F) | up (F)] of width 2F (Llama's gate_proj, up_proj)
enum class Activation : uint8_t { gelu_tanh, gelu_erf, relu, swiglu };
const char* activation_name(Activation a);  // "gelu_tanh", "gelu", "relu", "swiglu"
Activation parse_activation(const std::string& name);

struct ActivationShape {
  Activation kind = Activation::gelu_tanh;
  int64_t rows = 0;
  int64_t width = 0;  // F, the output width; the input is 2F wide for swiglu
  int64_t input_width() const { return kind == Activation::swiglu ? 2 * width : width; }
};
// out[rows, F] from in[rows, input_width].
void activation_forward(ThreadContext& ctx, const ActivationShape& s, const float* in, float* out);
// din[rows, input_width] from dout[rows, F] and the forward's input (overwrites din; for the
// element-wise kinds din may alias dout).
void activation_backward(ThreadContext& ctx, const ActivationShape& s, const float* in,
                         const float* dout, float* din);
// For training, the GELU kinds (activation_keeps_grad): out = act(in) and, in place of in, the
// derivative act'(in), so that the backward multiplies by it (activation_backward_from_grad:
// din = grad ⊙ dout, din may alias dout) instead of evaluating tanh or erf again. Bit for bit
// activation_forward's out and activation_backward's din.
bool activation_keeps_grad(Activation kind);
void activation_forward_keeping_grad(ThreadContext& ctx, const ActivationShape& s,
                                     float* in_then_grad, float* out);
void activation_backward_from_grad(ThreadContext& ctx, const ActivationShape& s, const float* grad,
                                   const float* dout, float* din);
// The forward for mixed precision, where the next product reads its input rounded to bf16 anyway:
// out = act(in) written rounded to bf16 only (as to_bf16 rounds activation_forward's values), in
// one pass instead of writing float32 and reading it back to round it. (The backward's
// grad ⊙ dout is the down product's epilogue there: matmul's OutputArg::multiply.)
void activation_forward_keeping_grad_bf16(ThreadContext& ctx, const ActivationShape& s,
                                          float* in_then_grad, bf16* out);

// x[rows, dim] = wte[token[r], :] (+ pos[r % period, :] when pos is non-null: the positions of a
// row are r mod `period`, i.e. rows are [batch, period]). Throws naming `tokens` on an id outside
// [0, vocab).
struct EmbeddingShape {
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t vocab = 0;
  int64_t period = 0;  // sequence length T of the [batch, T] token rows
  // When non-null, the position of each row ([rows]; packed sequences of different lengths)
  // instead of r mod period.
  const int64_t* positions = nullptr;
};
void embedding_forward(ThreadContext& ctx, const EmbeddingShape& s, const int32_t* tokens,
                       const float* wte, const float* pos, float* x);
// dwte[vocab, dim] += Σ rows with that token of dx; dpos[period, dim] += Σ over the batch (null
// to skip). Deterministic (rows in order).
void embedding_backward(ThreadContext& ctx, const EmbeddingShape& s, const int32_t* tokens,
                        const float* dx, float* dwte, float* dpos);

// The mean cross-entropy of softmax(logits[r, :]) against targets[r] over the rows whose target
// is ≥ 0 (a target of −1 is ignored, as PyTorch's ignore_index). With dlogits non-null it also
// writes the gradient of that mean (rows with an ignored target get 0; all zero when no row
// counts, and the loss is then 0). Throws naming `targets` on an id ≥ vocab or < −1.
struct CrossEntropyShape {
  int64_t rows = 0;
  int64_t vocab = 0;
  // The count the mean divides by: 0, the rows counted here; else the count over a whole batch
  // of which these rows are a part (a micro-batch: the parts' losses then add up to the mean).
  int64_t counted = 0;
};
double cross_entropy(ThreadContext& ctx, const CrossEntropyShape& s, const float* logits,
                     const int32_t* targets, float* dlogits);
// The rows of targets [rows] that count (≥ 0); throws naming `targets` as cross_entropy does.
int64_t counted_targets(int64_t rows, int64_t vocab, const int32_t* targets);

// sums[j] += Σ_r x[r·ldx + j] (j < cols), each column added in row order in double (one thread,
// SIMD across columns): a bias gradient's column sums.
void add_column_sums(const float* x, int64_t ldx, int64_t rows, int64_t cols, double* sums);

// Mixed precision's output gradient of a linear layer with a bias: y = x [rows, cols] rounded to
// bf16 (as to_bf16 rounds), and x's column sums added to dbias (in double, over fixed chunks of
// rows added in order: the same bits for any thread count). One pass over x where rounding and
// summing had been two.
void round_with_column_sums(ThreadContext& ctx, int64_t rows, int64_t cols, const float* x, bf16* y,
                            float* dbias);
// dbias[j] += Σ_r x[r, j] over bf16 rows x [rows, cols], summed as round_with_column_sums sums (in
// double over fixed chunks of rows: the same bits for any thread count): the bias gradient of a
// product whose output gradient exists only rounded (matmul's multiplying epilogue).
void add_column_sums(ThreadContext& ctx, int64_t rows, int64_t cols, const bf16* x, float* dbias);

}  // namespace headlight::ops

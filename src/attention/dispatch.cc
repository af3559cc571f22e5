#include "headlight/attention/dispatch.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "headlight/attention/cpu/flash_backward.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/reference.h"
#include "headlight/core/cpu_info.h"
#include "headlight/core/error.h"
#include "headlight/core/tensor.h"

namespace headlight::attention {

KernelChoice parse_kernel_choice(std::string_view name, std::string_view what) {
  if (name == "reference") return KernelChoice::reference;
  if (name == "fused") return KernelChoice::fused;
  if (name == "automatic" || name.empty()) return KernelChoice::automatic;
  fail("{}: unknown kernel '{}' (expected reference, fused or automatic)", what, name);
}

KernelChoice resolve_kernel(KernelChoice choice) {
  if (choice != KernelChoice::automatic) return choice;
  const char* env = std::getenv("HEADLIGHT_KERNEL");
  const KernelChoice from_env = parse_kernel_choice(env ? env : "", "HEADLIGHT_KERNEL");
  return from_env == KernelChoice::automatic ? KernelChoice::fused : from_env;
}

void forward(ThreadContext& ctx, const AttentionParams& p, KernelChoice choice) {
  if (resolve_kernel(choice) == KernelChoice::reference) {
    reference::forward(p);
    return;
  }
  if (p.probs == nullptr) {
    cpu::flash_forward(ctx, p);
    return;
  }
  // Probabilities asked for: the fused forward saves the log-sum-exp, and probabilities()
  // recomputes P from it tile by tile.
  AttentionParams fused = p;
  std::vector<float> lse;
  if (fused.lse == nullptr) {
    lse.resize(static_cast<size_t>(p.shape.batch * p.shape.heads * p.shape.len_q));
    fused.lse = lse.data();
  }
  fused.probs = nullptr;
  cpu::flash_forward(ctx, fused);
  cpu::probabilities(ctx, fused, {}, p.probs);
}

namespace {

// A contiguous float32 copy of operand x [B, H, R, W] (bf16 widened exactly), kept in `keep`.
Operand widened(const Operand& x, int64_t B, int64_t H, int64_t R, int64_t W, Tensor& keep) {
  keep = Tensor(DType::f32, {B, H, R, W});
  float* dst = keep.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < R; ++r, dst += W)
        for (int64_t e = 0; e < W; ++e) dst[e] = x.value(b, h, r, e);
  return Operand{
      .data = keep.data(), .batch_stride = H * R * W, .head_stride = R * W, .row_stride = W};
}

// Writes the contiguous float32 gradient `src` [B, H, R, W] into the caller's operand.
void store_all(const Tensor& src, const Operand& dst, int64_t B, int64_t H, int64_t R, int64_t W) {
  const float* x = src.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < R; ++r, x += W)
        for (int64_t e = 0; e < W; ++e) dst.store(b, h, r, e, x[e]);
}

// The bf16 backward for now: the fp32 fused backward on widened copies of q, k, v, dO (and the
// forward's output, when given with its lse), the gradients rounded once into the caller's
// operands. Exact products of the bf16 values, O(L·D) extra memory; the fp32 kernel's speed.
void backward_widened(ThreadContext& ctx, const AttentionParams& p) {
  const AttentionShape& s = p.shape;
  const int64_t B = s.batch, H = s.heads, G = s.kv_heads, L = s.len_q, S = s.len_kv;
  const int64_t D = s.head_dim, Dv = s.value_dim;
  AttentionParams f = p;
  Tensor q, k, v, dout, out, dq(DType::f32, {B, H, L, D}), dk(DType::f32, {B, G, S, D}),
      dv(DType::f32, {B, G, S, Dv});
  f.q = widened(p.q, B, H, L, D, q);
  f.k = widened(p.k, B, G, S, D, k);
  f.v = widened(p.v, B, G, S, Dv, v);
  f.dout = widened(p.dout, B, H, L, Dv, dout);
  if (p.out.defined() && p.lse) {
    f.out = widened(p.out, B, H, L, Dv, out);
  } else {
    f.out = {};
    f.lse = nullptr;
  }
  auto contiguous = [](Tensor& t) {
    return Operand{.data = t.data(),
                   .batch_stride = t.size(1) * t.size(2) * t.size(3),
                   .head_stride = t.size(2) * t.size(3),
                   .row_stride = t.size(3)};
  };
  f.dq = contiguous(dq);
  f.dk = contiguous(dk);
  f.dv = contiguous(dv);
  backward(ctx, f, KernelChoice::fused);
  store_all(dq, p.dq, B, H, L, D);
  store_all(dk, p.dk, B, G, S, D);
  store_all(dv, p.dv, B, G, S, Dv);
}

// The fused backwards need the forward's output and log-sum-exp: p as it is when the caller kept
// them, else p with them recomputed (an fp32 output) into `out` and `lse`.
AttentionParams with_forward_outputs(ThreadContext& ctx, const AttentionParams& p, Tensor& out,
                                     Tensor& lse) {
  AttentionParams fused = p;
  if (fused.out.defined() && fused.lse != nullptr) return fused;
  const AttentionShape& s = p.shape;
  out = Tensor(DType::f32, {s.batch, s.heads, s.len_q, s.value_dim});
  lse = Tensor(DType::f32, {s.batch, s.heads, s.len_q});
  fused.out = Operand{.data = out.data(),
                      .batch_stride = s.heads * s.len_q * s.value_dim,
                      .head_stride = s.len_q * s.value_dim,
                      .row_stride = s.value_dim};
  fused.lse = lse.data();
  fused.probs = nullptr;
  cpu::flash_forward(ctx, fused);
  return fused;
}

}  // namespace

void backward(ThreadContext& ctx, const AttentionParams& p, KernelChoice choice) {
  if (resolve_kernel(choice) == KernelChoice::reference) {
    reference::backward(p);
    return;
  }
  if (p.q.is_bf16()) {
    validate(p, /*backward=*/true);
    apply_isa_from_environment();  // before asking what this CPU may run
    if (!cpu::bf16_backward_available(p)) return backward_widened(ctx, p);
    Tensor out, lse;
    cpu::flash_backward_bf16(ctx, with_forward_outputs(ctx, p, out, lse));
    return;
  }
  Tensor out, lse;
  cpu::flash_backward(ctx, with_forward_outputs(ctx, p, out, lse));
}

}  // namespace headlight::attention

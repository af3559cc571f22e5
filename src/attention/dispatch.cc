#include "headlight/attention/dispatch.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "headlight/attention/cpu/flash_backward.h"
#include "headlight/attention/cpu/flash_forward.h"
#include "headlight/attention/reference.h"
#include "headlight/core/error.h"

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

void backward(ThreadContext& ctx, const AttentionParams& p, KernelChoice choice) {
  if (resolve_kernel(choice) == KernelChoice::reference) {
    reference::backward(p);
    return;
  }
  // The fused backward needs the forward's output and log-sum-exp; recompute them when the
  // caller did not keep them.
  AttentionParams fused = p;
  std::vector<float> out, lse;
  if (fused.out.data == nullptr || fused.lse == nullptr) {
    const AttentionShape& s = p.shape;
    out.resize(static_cast<size_t>(s.batch * s.heads * s.len_q * s.value_dim));
    lse.resize(static_cast<size_t>(s.batch * s.heads * s.len_q));
    fused.out = Operand{.data = out.data(),
                        .batch_stride = s.heads * s.len_q * s.value_dim,
                        .head_stride = s.len_q * s.value_dim,
                        .row_stride = s.value_dim};
    fused.lse = lse.data();
    fused.probs = nullptr;
    cpu::flash_forward(ctx, fused);
  }
  cpu::flash_backward(ctx, fused);
}

}  // namespace headlight::attention

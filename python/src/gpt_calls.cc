// The calls headlight.GPT and headlight.Model share (see gpt_calls.h).

#include "gpt_calls.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <span>

#include "conversions.h"
#include "headlight/core/error.h"
#include "headlight/inspect/importance.h"

namespace headlight::python {

py::dict named_arrays(const model::GPT& m, const float* base) {
  py::dict out;
  for (const auto& e : m.layout().entries())
    out[py::str(e.name)] = copy_to_numpy(base + e.offset, e.shape);
  return out;
}

py::array_t<float> attention_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                const py::object& out) {
  int64_t b, t;
  auto arr = token_array(tokens, "tokens", b, t);
  check(b == 1, "tokens: attention() takes one sequence, got a batch of {}", b);
  const auto& c = m.config();
  // (checked before the [n_layer, n_head, T, T] array is made)
  check(t <= c.block_size, "tokens: sequence of {} is longer than block_size {}", t, c.block_size);
  py::array_t<float> probs;
  if (out.is_none()) {
    probs = py::array_t<float>({c.n_layer, c.n_head, t, t});
  } else {
    // The caller's array, reused (no fresh pages to fault in on every call).
    check(py::isinstance<py::array_t<float>>(out) &&
              (out.cast<py::array>().flags() & py::array::c_style) != 0,
          "out: expected a C-contiguous float32 array");
    probs = out.cast<py::array_t<float>>();
    check(probs.ndim() == 4 && probs.shape(0) == c.n_layer && probs.shape(1) == c.n_head &&
              probs.shape(2) == t && probs.shape(3) == t && probs.writeable(),
          "out: expected a writeable [{}, {}, {}, {}] array", c.n_layer, c.n_head, t, t);
  }
  // The kernel writes every entry of the heads a layer has (zeros where masked); the heads a
  // pruned layer lacks are zero.
  for (int64_t l = 0; l < c.n_layer; ++l)
    std::fill(probs.mutable_data() + (l * c.n_head + c.heads(l)) * t * t,
              probs.mutable_data() + (l + 1) * c.n_head * t * t, 0.0f);
  model::ForwardOptions o;
  o.inference = true;
  o.logits = false;  // not returned: the LM head's product is skipped
  o.attention_probs = probs.mutable_data();
  {
    py::gil_scoped_release release;
    m.forward(ctx, arr.data(), b, t, o);
  }
  return probs;
}

py::dict capture_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                    const std::vector<std::pair<int64_t, int64_t>>& heads, bool stats) {
  int64_t b, t;
  auto arr = token_array(tokens, "tokens", b, t);
  check(b == 1, "tokens: capture() takes one sequence, got a batch of {}", b);
  const auto& c = m.config();
  check(t <= c.block_size, "tokens: sequence of {} is longer than block_size {}", t, c.block_size);
  for (const auto& [l, h] : heads)
    check(l >= 0 && l < c.n_layer && h >= 0 && h < c.heads(l),
          "heads: ({}, {}) is not a head of this model ({} layers, {} heads in that layer)", l, h,
          c.n_layer, l >= 0 && l < c.n_layer ? c.heads(l) : 0);
  py::dict out;
  model::ForwardOptions o;
  o.inference = true;
  o.logits = false;  // not returned: the LM head's product is skipped
  std::optional<py::array_t<float>> entropy, top;
  std::optional<py::array_t<int64_t>> argmax;
  if (stats) {
    const std::vector<int64_t> shape{c.n_layer, c.n_head, t};
    entropy.emplace(shape);
    top.emplace(shape);
    argmax.emplace(shape);
    std::fill(entropy->mutable_data(), entropy->mutable_data() + entropy->size(), 0.0f);
    std::fill(top->mutable_data(), top->mutable_data() + top->size(), 0.0f);
    std::fill(argmax->mutable_data(), argmax->mutable_data() + argmax->size(), int64_t{-1});
    o.attention_entropy = entropy->mutable_data();
    o.attention_max_weight = top->mutable_data();
    o.attention_argmax = argmax->mutable_data();
  }
  std::vector<py::array_t<float>> probs;
  for (size_t i = 0; i < heads.size(); ++i) probs.emplace_back(std::vector<int64_t>{t, t});
  {
    py::gil_scoped_release release;
    m.forward(ctx, arr.data(), b, t, o);
    for (size_t i = 0; i < heads.size(); ++i)
      m.head_attention(ctx, heads[i].first, heads[i].second, probs[i].mutable_data());
  }
  if (stats) {
    out["entropy"] = *entropy;
    out["max_weight"] = *top;
    out["argmax"] = *argmax;
  }
  py::dict chosen;
  for (size_t i = 0; i < heads.size(); ++i)
    chosen[py::make_tuple(heads[i].first, heads[i].second)] = probs[i];
  out["heads"] = chosen;
  return out;
}

py::array_t<double> importance_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                  int64_t seq) {
  int64_t b, t;
  auto arr = token_array(tokens, "tokens", b, t);
  const auto& c = m.config();
  check(c.lm_head, "head_importance: scored on the LM loss, and this model has no LM head");
  std::vector<double> scores;
  {
    py::gil_scoped_release release;
    const inspect::Dataset d =
        inspect::make_dataset(std::span<const int32_t>(arr.data(), static_cast<size_t>(b * t)), c,
                              seq, std::numeric_limits<int64_t>::max());
    scores = inspect::gradient_importance(ctx, m, d);
  }
  py::array_t<double> out({c.n_layer, c.n_head});
  std::copy(scores.begin(), scores.end(), out.mutable_data());
  return out;
}

std::vector<int32_t> generate_from(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                   int64_t max_new_tokens, const model::SamplingOptions& o) {
  int64_t b, t;
  auto arr = token_array(tokens, "tokens", b, t);
  check(b == 1, "tokens: generate() takes one sequence, got a batch of {}", b);
  py::gil_scoped_release release;
  return model::generate(ctx, m, {arr.data(), static_cast<size_t>(t)}, max_new_tokens, o);
}

}  // namespace headlight::python

// The calls headlight.GPT and headlight.Model share (see gpt_calls.h).

#include "gpt_calls.h"

#include <algorithm>

#include "conversions.h"
#include "headlight/core/error.h"

namespace headlight::python {

py::dict named_arrays(const model::GPT& m, const float* base) {
  py::dict out;
  for (const auto& e : m.layout().entries())
    out[py::str(e.name)] = copy_to_numpy(base + e.offset, e.shape);
  return out;
}

py::array_t<float> attention_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens) {
  int64_t b, t;
  auto arr = token_array(tokens, "tokens", b, t);
  check(b == 1, "tokens: attention() takes one sequence, got a batch of {}", b);
  const auto& c = m.config();
  py::array_t<float> probs({c.n_layer, c.n_head, t, t});
  std::fill(probs.mutable_data(), probs.mutable_data() + probs.size(), 0.0f);
  model::ForwardOptions o;
  o.inference = true;
  o.attention_probs = probs.mutable_data();
  {
    py::gil_scoped_release release;
    m.forward(ctx, arr.data(), b, t, o);
  }
  return probs;
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

// What headlight.GPT and headlight.Model (the engine's own models and loaded real ones) share:
// parameters or gradients as a dict of arrays, every head's attention, generation. Argument
// conversion and the GIL only.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"
#include "headlight/model/sampling.h"

namespace headlight::python {

namespace py = pybind11;

// {name: array} of the arena at `base` (m.params() or m.grads()) in m's layout.
py::dict named_arrays(const model::GPT& m, const float* base);

// Every layer's and head's attention [n_layer, n_head, T, T] for one sequence (zeros for the heads
// a pruned layer lacks), from an inference forward.
// `out`: None, or a C-contiguous float32 array of that shape to write into (and return).
py::array_t<float> attention_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                const py::object& out);

// A forward of one sequence that keeps what is asked and no [T, T] matrix of the others:
// {"entropy", "max_weight": float32 [n_layer, n_head, T], "argmax": int64 [n_layer, n_head, T]}
// when `stats`, and {"heads": {(layer, head): float32 [T, T]}} for the chosen heads (each
// recomputed from the forward's saved queries and keys, GPT::head_attention).
py::dict capture_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                    const std::vector<std::pair<int64_t, int64_t>>& heads, bool stats);

// Gradient importance [n_layer, n_head] (inspect::gradient_importance: Michel et al., normalised
// per layer) on windows of `seq` tokens of a token stream, with the model's objective.
py::array_t<double> importance_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                  int64_t seq);

// Binds attention, capture and head_importance on a class whose objects give (ctx, model) through
// `get` (headlight.GPT and headlight.Model).
template <typename Class, typename Get>
void bind_head_calls(Class& cls, Get get) {
  cls.def(
         "attention",
         [get](typename Class::type& self, const py::object& tokens, const py::object& out) {
           auto [ctx, m] = get(self);
           return attention_of(*ctx, *m, tokens, out);
         },
         py::arg("tokens"), py::arg("out") = py::none())
      .def(
          "capture",
          [get](typename Class::type& self, const py::object& tokens,
                const std::vector<std::pair<int64_t, int64_t>>& heads, bool stats) {
            auto [ctx, m] = get(self);
            return capture_of(*ctx, *m, tokens, heads, stats);
          },
          py::arg("tokens"), py::arg("heads") = std::vector<std::pair<int64_t, int64_t>>{},
          py::arg("stats") = true)
      .def(
          "head_importance",
          [get](typename Class::type& self, const py::object& tokens, int64_t seq) {
            auto [ctx, m] = get(self);
            return importance_of(*ctx, *m, tokens, seq);
          },
          py::arg("tokens"), py::arg("seq"))
      .def_property(
          "dtype",
          [get](typename Class::type& self) {
            auto [ctx, m] = get(self);
            return std::string(dtype_name(m->dtype()));
          },
          [get](typename Class::type& self, const std::string& name) {
            auto [ctx, m] = get(self);
            m->set_dtype(parse_dtype(name, "dtype"));
          },
          "The dtype of inference forwards' dense products: 'float32' or 'bfloat16' (weights "
          "and each product's input rounded to bf16, fp32 accumulation and activations).");
}

// New tokens after one sequence of `tokens`.
std::vector<int32_t> generate_from(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                   int64_t max_new_tokens, const model::SamplingOptions& o);

}  // namespace headlight::python

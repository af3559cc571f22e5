// What headlight.GPT and headlight.Model (the engine's own models and loaded real ones) share:
// parameters or gradients as a dict of arrays, every head's attention, generation. Argument
// conversion and the GIL only.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
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
py::array_t<float> attention_of(ThreadContext& ctx, model::GPT& m, const py::object& tokens);

// New tokens after one sequence of `tokens`.
std::vector<int32_t> generate_from(ThreadContext& ctx, model::GPT& m, const py::object& tokens,
                                   int64_t max_new_tokens, const model::SamplingOptions& o);

}  // namespace headlight::python

// numpy <-> headlight conversions for the bindings: arrays in as TensorViews (float32 or bool, any
// strides), Tensors out as numpy arrays that own their buffer.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "headlight/attention/head_gates.h"
#include "headlight/core/tensor.h"

namespace headlight::python {

namespace py = pybind11;

// An array holding `obj` as float32 (converted when it has another dtype); throws ValueError
// naming `what` when `obj` is not array-like.
py::array as_float32(const py::handle& obj, const char* what);
// Whether `array` holds ml_dtypes.bfloat16 elements.
bool is_bfloat16(const py::array& array);
// An attention input: a bfloat16 array as it is, anything else as as_float32.
py::array as_attention_input(const py::handle& obj, const char* what);
// Refuses bfloat16 mixed with another dtype among attention inputs (objs[i] named names[i]), naming
// the first array whose dtype differs from objs[0]'s and both dtypes as the caller gave them: after
// as_attention_input a float16 or float64 array would read as float32.
void check_bfloat16_not_mixed(const std::vector<py::handle>& objs,
                              const std::vector<const char*>& names);
// A mask array: bool arrays stay bool, anything else becomes float32.
py::array as_mask(const py::handle& obj, const char* what);

// A view of an array produced by as_float32/as_mask/as_attention_input (it must outlive the
// view): float32, bool or bfloat16. Needs the GIL (it reads the dtype's name).
TensorView view_of(const py::array& array);

// Moves `tensor` into a numpy array that owns it (bfloat16 tensors become ml_dtypes.bfloat16
// arrays).
py::array to_numpy(Tensor&& tensor);
// A numpy copy of `data` with `shape` (contiguous float32).
py::array_t<float> copy_to_numpy(const float* data, const Shape& shape);

// Per-head gates (or their gradients) as a numpy array of `shape` ([heads] for a module, [layers,
// heads] for a model), and new gate values from an array of that shape (ValueError naming `what`).
py::array_t<float> gates_to_numpy(const attention::HeadGates& gates, bool grads,
                                  const Shape& shape);
void set_gates(attention::HeadGates& gates, const py::handle& values, const Shape& shape,
               const char* what);

using TokenArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
// tokens as a C-contiguous int32 array of 1 or 2 dims → [B, T]; `what` names it in errors.
TokenArray token_array(const py::handle& obj, const char* what, int64_t& batch, int64_t& seq);

// The bytes of a str (UTF-8) or bytes object.
std::string text_bytes(const py::object& text);

}  // namespace headlight::python

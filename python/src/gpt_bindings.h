// Binding groups registered by the module in bindings.cc: the GPT engine (gpt_bindings.cc) and the
// file readers (io_bindings.cc), real models (load_bindings.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace headlight::python {

void bind_gpt(pybind11::module_& m);
void bind_io(pybind11::module_& m);
void bind_load(pybind11::module_& m);

}  // namespace headlight::python

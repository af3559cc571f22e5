// Binding groups registered by the module in bindings.cc: the GPT engine (gpt_bindings.cc) and the
// file readers (io_bindings.cc), real models (load_bindings.cc), head inspection of attention
// computed elsewhere (inspect_bindings.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace headlight::python {

void bind_gpt(pybind11::module_& m);
void bind_io(pybind11::module_& m);
void bind_load(pybind11::module_& m);
void bind_inspect(pybind11::module_& m);  // inspect_bindings.cc

}  // namespace headlight::python

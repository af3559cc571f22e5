// Bindings of the GPT engine (gpt_bindings.cc), registered by the module in bindings.cc.
#pragma once

#include <pybind11/pybind11.h>

namespace headlight::python {

void bind_gpt(pybind11::module_& m);

}  // namespace headlight::python

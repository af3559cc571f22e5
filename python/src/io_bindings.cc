// Bindings of the file readers: headlight.read_gguf. Thin: conversion to Python objects only.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "gpt_bindings.h"
#include "headlight/io/gguf.h"

namespace headlight::python {

namespace py = pybind11;

namespace {

py::object to_python(const io::GgufValue& v, const std::string& key) {
  using T = io::GgufValueType;
  switch (v.type) {
    case T::string:
      // Token texts of a vocabulary need not be valid UTF-8 on their own: bytes then.
      try {
        return py::str(v.s);
      } catch (const py::error_already_set&) {
        return py::bytes(v.s);
      }
    case T::f32:
    case T::f64:
      return py::float_(v.f);
    case T::boolean:
      return py::bool_(v.i != 0);
    case T::array: {
      py::list out;
      for (const io::GgufValue& item : v.items) out.append(to_python(item, key));
      return out;
    }
    case T::u8:
    case T::u16:
    case T::u32:
    case T::u64:
      return py::int_(v.u);
    default:
      return py::int_(v.i);
  }
}

py::tuple read_gguf(const std::string& path) {
  const io::GgufFile file(path);
  py::dict metadata;
  for (const std::string& key : file.index().keys)
    metadata[py::str(key)] = to_python(*file.value(key), key);
  py::dict tensors;
  for (const io::GgufTensorInfo& t : file.index().tensors) {
    py::array_t<float> a(t.shape());
    file.read_f32(t.name, a.mutable_data());
    tensors[py::str(t.name)] = a;
  }
  return py::make_tuple(metadata, tensors);
}

}  // namespace

void bind_io(py::module_& m) {
  m.def("read_gguf", &read_gguf, py::arg("path"),
        "(metadata, tensors) of a GGUF file: metadata as Python values, every tensor dequantised "
        "to a float32 array in PyTorch's dimension order (ne reversed).");
}

}  // namespace headlight::python

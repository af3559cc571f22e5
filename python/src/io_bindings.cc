// Bindings of the file readers and of real models' tokenizers: headlight.read_gguf,
// headlight.WordPieceTokenizer and headlight.ByteLevelBPETokenizer. Thin: conversion to Python
// objects only.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gpt_bindings.h"
#include "headlight/core/error.h"
#include "headlight/core/read_file.h"
#include "headlight/io/gguf.h"
#include "headlight/io/safetensors.h"
#include "headlight/load/gguf_tokenizer.h"
#include "headlight/model/byte_bpe.h"
#include "headlight/model/wordpiece.h"

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

// (metadata, tensors) of a safetensors file, or of the shards a model.safetensors.index.json names:
// the floating-point tensors as float32 arrays (integer buffers such as position ids are left out).
py::tuple read_safetensors(const std::string& path) {
  const bool sharded = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  std::unique_ptr<TensorSource> src;
  std::vector<std::string> floats;
  if (sharded) {
    src = std::make_unique<io::ShardedSafetensors>(path);
    floats = src->names();
  } else {
    auto file = std::make_unique<io::SafetensorsFile>(path);
    for (const auto& e : file->index().tensors)
      if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16" || e.dtype == "F64")
        floats.push_back(e.name);
    src = std::move(file);
  }
  py::dict tensors;
  for (const std::string& name : floats) {
    py::array_t<float> a(src->shape(name));
    src->read_f32(name, a.mutable_data());
    tensors[py::str(name)] = a;
  }
  py::dict metadata;
  if (!sharded)
    for (const auto& [k, v] : static_cast<const io::SafetensorsFile&>(*src).index().metadata)
      metadata[py::str(k)] = py::str(v);
  return py::make_tuple(metadata, tensors);
}

}  // namespace

void bind_io(py::module_& m) {
  py::class_<model::WordPieceTokenizer>(m, "WordPieceTokenizer")
      .def_static(
          "from_file",
          [](const std::string& path) {
            return model::WordPieceTokenizer::from_hf_json(read_file(path), path);
          },
          py::arg("path"), "From a Hugging Face tokenizer.json whose model is WordPiece.")
      .def("encode", &model::WordPieceTokenizer::encode, py::arg("text"),
           py::arg("add_special_tokens") = true)
      .def("decode", &model::WordPieceTokenizer::decode, py::arg("ids"),
           py::arg("skip_special_tokens") = true)
      .def_property_readonly("vocab_size", &model::WordPieceTokenizer::vocab_size)
      .def("token", &model::WordPieceTokenizer::token, py::arg("id"));
  py::class_<model::ByteLevelBpeTokenizer>(m, "ByteLevelBPETokenizer")
      .def_static(
          "from_file",
          [](const std::string& path) {
            return model::ByteLevelBpeTokenizer::from_hf_json(read_file(path), path);
          },
          py::arg("path"), "From a Hugging Face tokenizer.json whose model is byte-level BPE.")
      .def_static(
          "from_gguf",
          [](const std::string& path) { return load::tokenizer_from_gguf(io::GgufFile(path)); },
          py::arg("path"), "The tokenizer a GGUF file's metadata describes.")
      .def("encode", &model::ByteLevelBpeTokenizer::encode, py::arg("text"),
           py::arg("add_special_tokens") = true)
      .def(
          "decode",
          [](const model::ByteLevelBpeTokenizer& t, const std::vector<int32_t>& ids, bool skip) {
            return t.decode(ids, skip);
          },
          py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def_property_readonly("vocab_size", &model::ByteLevelBpeTokenizer::vocab_size)
      .def("token", &model::ByteLevelBpeTokenizer::token, py::arg("id"));
  m.def("read_safetensors", &read_safetensors, py::arg("path"),
        "(metadata, tensors) of a safetensors file or of the shards a model.safetensors.index.json "
        "names: floating-point tensors as float32 arrays.");
  m.def("read_gguf", &read_gguf, py::arg("path"),
        "(metadata, tensors) of a GGUF file: metadata as Python values, every tensor dequantised "
        "to a float32 array in PyTorch's dimension order (ne reversed).");
}

}  // namespace headlight::python

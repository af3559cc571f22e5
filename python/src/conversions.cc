#include "conversions.h"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "headlight/core/error.h"

namespace headlight::python {

namespace {

py::array ensure_array(const py::handle& obj, const char* what) {
  py::array array = py::array::ensure(obj);
  if (!array) throw Error(std::string(what) + ": expected an array (numpy or convertible)");
  return array;
}

}  // namespace

py::array as_float32(const py::handle& obj, const char* what) {
  py::array array = ensure_array(obj, what);
  if (array.dtype().equal(py::dtype::of<float>())) return array;
  const char kind = array.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b' && !is_bfloat16(array)) {
    throw Error(std::string(what) + ": expected a real-valued array, got dtype " +
                std::string(py::str(array.dtype())));
  }
  return array.attr("astype")("float32");
}

bool is_bfloat16(const py::array& array) {
  return array.dtype().kind() == 'V' && array.itemsize() == 2 &&
         std::string(py::str(array.dtype())) == "bfloat16";
}

py::array as_attention_input(const py::handle& obj, const char* what) {
  py::array array = ensure_array(obj, what);
  return is_bfloat16(array) ? array : as_float32(array, what);
}

void check_bfloat16_not_mixed(const std::vector<py::handle>& objs,
                              const std::vector<const char*>& names) {
  std::vector<py::array> arrays;
  for (size_t i = 0; i < objs.size(); ++i) arrays.push_back(ensure_array(objs[i], names[i]));
  const bool first = is_bfloat16(arrays[0]);
  for (size_t i = 1; i < arrays.size(); ++i)
    if (is_bfloat16(arrays[i]) != first)
      throw Error(std::string(names[i]) + ": dtype " + std::string(py::str(arrays[i].dtype())) +
                  " differs from " + names[0] + "'s " + std::string(py::str(arrays[0].dtype())) +
                  " (bfloat16 inputs must all be bfloat16)");
}

py::array as_mask(const py::handle& obj, const char* what) {
  py::array array = ensure_array(obj, what);
  if (array.dtype().kind() == 'b') return array;
  return as_float32(array, what);
}

TensorView view_of(const py::array& array) {
  const DType dtype = array.dtype().kind() == 'b' ? DType::boolean
                      : is_bfloat16(array)        ? DType::bf16
                                                  : DType::f32;
  const auto itemsize = static_cast<int64_t>(array.itemsize());
  Shape shape(static_cast<size_t>(array.ndim())), strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    shape[i] = array.shape(static_cast<py::ssize_t>(i));
    const int64_t bytes = array.strides(static_cast<py::ssize_t>(i));
    if (bytes % itemsize != 0) throw Error("array strides are not a multiple of the item size");
    strides[i] = bytes / itemsize;
  }
  return TensorView(const_cast<void*>(array.data()), dtype, std::move(shape), std::move(strides));
}

py::array to_numpy(Tensor&& tensor) {
  auto* owned = new Tensor(std::move(tensor));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
  if (owned->dtype() == DType::boolean) {
    return py::array_t<bool>(shape, owned->data<bool>(), free_when_done);
  }
  if (owned->dtype() == DType::bf16) {
    const py::dtype bfloat16 =
        py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16"));
    return py::array(bfloat16, shape, owned->data<std::byte>(), free_when_done);
  }
  return py::array_t<float>(shape, owned->data<float>(), free_when_done);
}

py::array_t<float> copy_to_numpy(const float* data, const Shape& shape) {
  py::array_t<float> out(shape);
  std::memcpy(out.mutable_data(), data, sizeof(float) * static_cast<size_t>(out.size()));
  return out;
}

py::array_t<float> gates_to_numpy(const attention::HeadGates& gates, bool grads,
                                  const Shape& shape) {
  return copy_to_numpy(grads ? gates.grads() : gates.values(), shape);
}

void set_gates(attention::HeadGates& gates, const py::handle& values, const Shape& shape,
               const char* what) {
  const py::array a = as_float32(values, what);
  const Tensor t = contiguous_copy(view_of(a));
  check(t.shape() == shape, "{}: shape {} must be {}", what, shape_string(t.shape()),
        shape_string(shape));
  gates.restore({t.data(), static_cast<size_t>(t.numel())});
}

// tokens as a C-contiguous int32 array of 1 or 2 dims → [B, T]; `what` names it in errors.
TokenArray token_array(const py::handle& obj, const char* what, int64_t& batch, int64_t& seq) {
  py::array raw = py::array::ensure(obj);
  if (!raw) throw Error(fmt::format("{}: expected an integer array", what));
  if (raw.dtype().kind() != 'i' && raw.dtype().kind() != 'u')
    throw Error(fmt::format("{}: expected an integer array, got dtype {}", what,
                            std::string(py::str(raw.dtype()))));
  auto arr = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(raw);
  if (arr.ndim() == 1) {
    batch = 1;
    seq = arr.shape(0);
  } else if (arr.ndim() == 2) {
    batch = arr.shape(0);
    seq = arr.shape(1);
  } else {
    std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
    throw Error(
        fmt::format("{}: expected [batch, seq] or [seq], got shape {}", what, shape_string(shape)));
  }
  return arr;
}

// The bytes of a str (UTF-8) or bytes object.
std::string text_bytes(const py::object& text) {
  return py::isinstance<py::bytes>(text) ? std::string(py::bytes(text))
                                         : std::string(py::str(text));
}

}  // namespace headlight::python

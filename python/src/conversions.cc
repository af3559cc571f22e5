#include "conversions.h"

#include <string>

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
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b') {
    throw Error(std::string(what) + ": expected a real-valued array, got dtype " +
                std::string(py::str(array.dtype())));
  }
  return array.attr("astype")("float32");
}

py::array as_mask(const py::handle& obj, const char* what) {
  py::array array = ensure_array(obj, what);
  if (array.dtype().kind() == 'b') return array;
  return as_float32(array, what);
}

TensorView view_of(const py::array& array) {
  const DType dtype = array.dtype().kind() == 'b' ? DType::boolean : DType::f32;
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
  return py::array_t<float>(shape, owned->data<float>(), free_when_done);
}

}  // namespace headlight::python

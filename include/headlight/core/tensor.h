// Tensor (owning, 64-byte aligned, contiguous) and TensorView (borrowed, any strides).
//
// Shapes and strides are in elements, row-major by default. A stride of 0 broadcasts a dimension.
// float32 is the compute type; boolean (one byte, 0 or 1, as numpy's bool) carries masks; bf16
// (headlight/core/bf16.h) is a storage type: attention reads and writes it, arithmetic is fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "headlight/core/error.h"

namespace headlight {

enum class DType : uint8_t { f32, bf16, boolean };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// "float32"/"f32", "bfloat16"/"bf16" or "bool"; throws naming `what` on anything else.
DType parse_dtype(std::string_view name, std::string_view what);

using Shape = std::vector<int64_t>;

// Number of elements of `shape`; throws Error naming `what` on a negative extent or on overflow of
// the element count (or its byte size for elements of `element_size` bytes).
int64_t checked_numel(const Shape& shape, std::string_view what, size_t element_size = 4);

// Row-major strides for `shape`.
Shape contiguous_strides(const Shape& shape);

// The broadcast of two shapes under numpy/PyTorch rules; throws naming `what` when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what);

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape, Shape strides);
  // A row-major view.
  TensorView(void* data, DType dtype, Shape shape);

  bool empty_view() const { return data_ == nullptr && shape_.empty(); }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Negative `i` counts from the end, as in Python.
  int64_t size(int64_t i) const { return shape_[axis(i)]; }
  int64_t stride(int64_t i) const { return strides_[axis(i)]; }
  int64_t numel() const;
  bool is_contiguous() const;

  // The same data seen with `shape` (numpy broadcasting: new leading dims and size-1 dims get
  // stride 0). Throws naming `what` when not broadcastable.
  TensorView broadcast_to(const Shape& shape, std::string_view what) const;
  // Drops leading dims or adds size-1 leading dims so that the view has `rank` dims (only size-1
  // dims can be dropped).
  TensorView with_rank(int64_t rank) const;

 private:
  size_t axis(int64_t i) const { return static_cast<size_t>(i < 0 ? i + dim() : i); }

  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised contents.
  Tensor(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  static Tensor zeros(Shape shape) { return zeros(DType::f32, std::move(shape)); }
  static Tensor empty(Shape shape) { return Tensor(DType::f32, std::move(shape)); }

  bool defined() const { return data_ != nullptr || !shape_.empty(); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t i) const { return shape_[static_cast<size_t>(i < 0 ? i + dim() : i)]; }
  int64_t numel() const { return numel_; }
  template <typename T = float>
  T* data() {
    return reinterpret_cast<T*>(data_.get());
  }
  template <typename T = float>
  const T* data() const {
    return reinterpret_cast<const T*>(data_.get());
  }
  TensorView view() const;
  // Same elements, new shape (element counts must agree).
  Tensor reshaped(Shape shape) &&;
  void fill(float value);

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  DType dtype_ = DType::f32;
  Shape shape_;
  int64_t numel_ = 0;
  std::unique_ptr<std::byte[], Free> data_;
};

// A row-major copy of any view (float32 or boolean).
Tensor contiguous_copy(const TensorView& view);

// Sums `tensor` (float32, contiguous) over broadcast dims so that it has `shape`: the reverse of
// broadcasting `shape` up to tensor.shape(), as a gradient needs.
Tensor sum_to_shape(const Tensor& tensor, const Shape& shape);

}  // namespace headlight

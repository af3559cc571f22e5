#include "headlight/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace headlight {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::boolean:
      return 1;
  }
  return 0;
}

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "float32" || name == "f32") return DType::f32;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "bool") return DType::boolean;
  fail("{}: unknown dtype '{}' (expected float32, bfloat16 or bool)", what, name);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

int64_t checked_numel(const Shape& shape, std::string_view what, size_t element_size) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(element_size);
  int64_t n = 1;
  for (int64_t d : shape) {
    check(d >= 0, "{}: negative extent in shape {}", what, shape_string(shape));
    if (d != 0 && n > limit / d) {
      fail("{}: shape {} has too many elements (the element count overflows)", what,
           shape_string(shape));
    }
    n *= d;
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      fail("{}: shapes {} and {} do not broadcast", what, shape_string(a), shape_string(b));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// TensorView

TensorView::TensorView(void* data, DType dtype, Shape shape, Shape strides)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
  check(shape_.size() == strides_.size(), "TensorView: shape {} and strides {} differ in rank",
        shape_string(shape_), shape_string(strides_));
}

TensorView::TensorView(void* data, DType dtype, Shape shape)
    : data_(data), dtype_(dtype), shape_(std::move(shape)) {
  strides_ = contiguous_strides(shape_);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

TensorView TensorView::broadcast_to(const Shape& shape, std::string_view what) const {
  check(shape.size() >= shape_.size(), "{}: shape {} cannot broadcast to {}", what,
        shape_string(shape_), shape_string(shape));
  const size_t lead = shape.size() - shape_.size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t have = shape_[i], want = shape[lead + i];
    if (have == want) {
      strides[lead + i] = want == 1 ? 0 : strides_[i];
    } else if (have == 1) {
      strides[lead + i] = 0;
    } else {
      fail("{}: shape {} cannot broadcast to {}", what, shape_string(shape_), shape_string(shape));
    }
  }
  return TensorView(data_, dtype_, shape, std::move(strides));
}

TensorView TensorView::with_rank(int64_t rank) const {
  Shape shape = shape_, strides = strides_;
  while (static_cast<int64_t>(shape.size()) > rank) {
    check(shape.front() == 1, "with_rank: cannot drop dim of size {} from {}", shape.front(),
          shape_string(shape_));
    shape.erase(shape.begin());
    strides.erase(strides.begin());
  }
  while (static_cast<int64_t>(shape.size()) < rank) {
    shape.insert(shape.begin(), 1);
    strides.insert(strides.begin(), 0);
  }
  return TensorView(data_, dtype_, std::move(shape), std::move(strides));
}

// ---------------------------------------------------------------------------------------------
// Tensor

// Tensors of kHugePagesFrom bytes and more start on a 2 MiB boundary and ask Linux for
// transparent huge pages (madvise, as numpy does for its large arrays): a stream over them
// then needs one TLB entry per 2 MiB instead of 512, and on a virtual machine each 4 KB miss is
// a walk of two page tables. Zen 4 under KVM, 2026-12-07: a streaming read of 512 MiB went from
// 33–35 to 35–37 GB/s with the two vCPUs on one core complex and from 47–54 to 58–64 apart; decode
// from a bf16 cache (32 heads over 8, D = 128, 4,096 keys) from 0.52–0.56 to 0.47–0.50 ms. The
// cost is at first touch, where a whole 2 MiB page is zeroed: a 4-second embedding job there
// spent 0.3 s more in the kernel, a 16-second one no more in all
// (docs/notes/2026-12-07-huge-pages-and-decode-rows.md).
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kHugePagesFrom = size_t{4} << 20;

void Tensor::Free::operator()(std::byte* p) const {
  std::free(p);
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel(shape_, "Tensor", dtype_size(dtype_));
  size_t bytes = static_cast<size_t>(numel_) * dtype_size(dtype_);
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = nullptr;
  if (bytes >= kHugePagesFrom) {
    bytes = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    p = std::aligned_alloc(kHugePageBytes, bytes);
#if defined(MADV_HUGEPAGE)
    if (p) madvise(p, bytes, MADV_HUGEPAGE);  // advice: where the system declines, 4 KB pages
#endif
  } else {
    p = std::aligned_alloc(64, bytes);
  }
  if (!p)
    fail_allocation(fmt::format("Tensor {} {}", shape_string(shape_), dtype_name(dtype_)), bytes);
  data_.reset(static_cast<std::byte*>(p));
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  std::memset(t.data_.get(), 0, static_cast<size_t>(t.numel_) * dtype_size(dtype));
  return t;
}

TensorView Tensor::view() const {
  return TensorView(const_cast<std::byte*>(data_.get()), dtype_, shape_);
}

Tensor Tensor::reshaped(Shape shape) && {
  const int64_t n = checked_numel(shape, "reshape", dtype_size(dtype_));
  check(n == numel_, "reshape: cannot view shape {} as {}", shape_string(shape_),
        shape_string(shape));
  shape_ = std::move(shape);
  return std::move(*this);
}

void Tensor::fill(float value) {
  check(dtype_ == DType::f32, "fill: tensor is {}, not float32", dtype_name(dtype_));
  float* p = data<float>();
  for (int64_t i = 0; i < numel_; ++i) p[i] = value;
}

// ---------------------------------------------------------------------------------------------
// Copies and reductions

namespace {

// Calls fn(flat_index, offset) for every element of shape/strides in row-major order.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn&& fn) {
  const size_t rank = shape.size();
  for (int64_t d : shape)
    if (d == 0) return;
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0, flat = 0;
  while (true) {
    fn(flat++, offset);
    size_t k = rank;
    while (k > 0) {
      --k;
      if (++index[k] < shape[k]) {
        offset += strides[k];
        break;
      }
      offset -= strides[k] * (shape[k] - 1);
      index[k] = 0;
      if (k == 0) return;
    }
    if (rank == 0) return;
  }
}

}  // namespace

Tensor contiguous_copy(const TensorView& view) {
  Tensor out(view.dtype(), view.shape());
  const size_t esize = dtype_size(view.dtype());
  const auto* src = static_cast<const std::byte*>(view.data());
  std::byte* dst = out.data<std::byte>();
  for_each_offset(view.shape(), view.strides(), [&](int64_t flat, int64_t offset) {
    std::memcpy(dst + flat * esize, src + offset * static_cast<int64_t>(esize), esize);
  });
  return out;
}

Tensor sum_to_shape(const Tensor& tensor, const Shape& shape) {
  check(tensor.dtype() == DType::f32, "sum_to_shape: tensor is {}", dtype_name(tensor.dtype()));
  if (tensor.shape() == shape) {
    Tensor out(DType::f32, shape);
    std::memcpy(out.data(), tensor.data(), static_cast<size_t>(tensor.numel()) * 4);
    return out;
  }
  Tensor out = Tensor::zeros(shape);
  // Walk the big tensor in order; its element lands in out at the broadcast (stride-0) offset.
  TensorView target = out.view().broadcast_to(tensor.shape(), "sum_to_shape");
  const float* src = tensor.data();
  float* dst = out.data();
  for_each_offset(target.shape(), target.strides(),
                  [&](int64_t flat, int64_t offset) { dst[offset] += src[flat]; });
  return out;
}

}  // namespace headlight

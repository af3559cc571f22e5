// RemappedSource (see remap.h).

#include "src/load/remap.h"

#include <algorithm>
#include <cstring>

#include "headlight/core/error.h"

namespace headlight::load {

RemappedSource::RemappedSource(const TensorSource& source, std::string file)
    : source_(source), file_(std::move(file)) {}

void RemappedSource::add(const std::string& name, const Shape& shape,
                         const std::vector<Part>& parts) {
  int64_t rows = 0, cols = -1;
  for (const Part& p : parts) {
    check(source_.contains(p.name), "{}: missing tensor \"{}\" (shape {})", file_, p.name,
          shape_string(p.shape));
    const Shape got = source_.shape(p.name);
    check(got == p.shape, "{}: tensor \"{}\" has shape {}, the model's config needs {}", file_,
          p.name, shape_string(got), shape_string(p.shape));
    check(!p.transpose || p.shape.size() == 2, "{}: \"{}\" cannot be transposed", file_, p.name);
    const Shape s = p.transpose ? Shape{p.shape[1], p.shape[0]} : p.shape;
    rows += s.empty() ? 1 : s[0];
    const int64_t c = s.size() > 1 && s[0] > 0 ? checked_numel(s, p.name) / s[0] : 1;
    check(cols < 0 || cols == c, "{}: the parts of \"{}\" differ in width", file_, name);
    cols = c;
    if (p.unpermute_heads > 0)
      check(s.size() == 2 && s[0] % (2 * p.unpermute_heads) == 0,
            "{}: \"{}\" has {} rows, not an even number per head for {} heads", file_, p.name,
            s.empty() ? 0 : s[0], p.unpermute_heads);
  }
  check(!parts.empty() && rows * cols == checked_numel(shape, name),
        "{}: the tensors for \"{}\" do not make {}", file_, name, shape_string(shape));
  if (targets_.find(name) == targets_.end()) order_.push_back(name);
  targets_[name] = {shape, parts};
}

std::vector<std::string> RemappedSource::names() const {
  return order_;
}

bool RemappedSource::contains(const std::string& name) const {
  return targets_.count(name) == 1;
}

Shape RemappedSource::shape(const std::string& name) const {
  const auto it = targets_.find(name);
  check(it != targets_.end(), "{}: no tensor for \"{}\"", file_, name);
  return it->second.shape;
}

std::string RemappedSource::stored_dtype(const std::string& name) const {
  const auto it = targets_.find(name);
  check(it != targets_.end(), "{}: no tensor for \"{}\"", file_, name);
  std::vector<std::string> types;
  for (const Part& p : it->second.parts) {
    const std::string t = source_.stored_dtype(p.name);
    if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
  }
  std::string out;
  for (const std::string& t : types) out += (out.empty() ? "" : "+") + t;
  return out;
}

void RemappedSource::read_f32(const std::string& name, float* dst) const {
  const auto it = targets_.find(name);
  check(it != targets_.end(), "{}: no tensor for \"{}\"", file_, name);
  for (const Part& p : it->second.parts) {
    const int64_t n = checked_numel(p.shape, p.name);
    if (!p.transpose && p.unpermute_heads == 0) {
      source_.read_f32(p.name, dst);
      dst += n;
      continue;
    }
    std::vector<float> tmp(static_cast<size_t>(n));
    source_.read_f32(p.name, tmp.data());
    if (p.transpose) {
      // [in, out] → [out, in]
      const int64_t in = p.shape[0], out = p.shape[1];
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) dst[o * in + i] = tmp[static_cast<size_t>(i * out + o)];
    } else {
      // llama.cpp stores row (h, j, i) of a head [hd/2, 2] where transformers has (h, i, j) of
      // [2, hd/2]: rotary pairs interleaved instead of split in halves.
      const int64_t rows = p.shape[0], cols = p.shape[1], H = p.unpermute_heads;
      const int64_t half = rows / H / 2;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < half; ++j)
            std::memcpy(dst + ((h * 2 + i) * half + j) * cols,
                        tmp.data() + ((h * half + j) * 2 + i) * cols,
                        sizeof(float) * static_cast<size_t>(cols));
    }
    dst += n;
  }
}

}  // namespace headlight::load

// TensorSource: where named weights come from, without the reader of a file format. The model
// layer reads its parameters through this interface (io/ implements it for safetensors files), so
// that the model never parses files and tests can hand it weights from memory.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "headlight/core/tensor.h"

namespace headlight {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Names of every tensor, in the order of the source.
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // Shape of a tensor; throws Error naming it when absent.
  virtual Shape shape(const std::string& name) const = 0;
  // The tensor converted to float32 into dst (numel(shape(name)) floats).
  virtual void read_f32(const std::string& name, float* dst) const = 0;
  // The tensor's element type where it is stored, as its format names it ("F32", "BF16", "Q4_K",
  // …; parts of different types joined by "+"); throws Error naming it when absent.
  virtual std::string stored_dtype(const std::string& name) const = 0;
  // A string entry of the source's metadata, if present.
  virtual std::optional<std::string> metadata(const std::string& key) const = 0;
};

}  // namespace headlight

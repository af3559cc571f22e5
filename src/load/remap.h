// RemappedSource: the weights of a file in another model's naming, presented under the names and
// shapes of headlight's parameter layout. Each target tensor is made of parts of the file's
// tensors, stacked along the rows: a part may be transposed (GPT-2's Conv1D weights are stored
// [in, out]) or have llama.cpp's rotary row permutation undone (GGUF q and k projections). Every
// part is checked against the file when it is added, so that a missing tensor or a wrong shape is
// an Error naming the file and the tensor before any weight is read.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/core/tensor_source.h"

namespace headlight::load {

struct Part {
  std::string name;             // in the file
  Shape shape;                  // its shape in the file, as it must be
  bool transpose = false;       // a 2-D [in, out] tensor, stored transposed as [out, in]
  int64_t unpermute_heads = 0;  // > 0: undo llama.cpp's q/k row permutation over this many heads
};

class RemappedSource : public TensorSource {
 public:
  // `file` names the source in errors; `source` must outlive this object.
  RemappedSource(const TensorSource& source, std::string file);

  // Target `name` of `shape` (rows = the sum of the parts' rows after transposition).
  void add(const std::string& name, const Shape& shape, const std::vector<Part>& parts);
  // Whether the file has `name` (to choose between variants of a checkpoint's naming).
  bool has(const std::string& name) const { return source_.contains(name); }

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  void read_f32(const std::string& name, float* dst) const override;
  std::string stored_dtype(const std::string& name) const override;  // the parts' types
  std::optional<std::string> metadata(const std::string&) const override { return std::nullopt; }

 private:
  struct Target {
    Shape shape;
    std::vector<Part> parts;
  };
  const TensorSource& source_;
  std::string file_;
  std::vector<std::string> order_;
  std::map<std::string, Target> targets_;
};

}  // namespace headlight::load

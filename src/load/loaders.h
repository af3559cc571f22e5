// The readers behind load_model (load/model.h), one per format.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "headlight/core/tensor_source.h"
#include "headlight/load/model.h"

namespace headlight::load {

Model load_hf_folder(const std::string& path);
Model load_gguf(const std::string& path);

// Model::stored_dtypes of `net`'s parameters as `source` (their names) stores them.
std::vector<std::pair<std::string, int64_t>> stored_dtypes(const TensorSource& source,
                                                           const model::GPT& net);

}  // namespace headlight::load

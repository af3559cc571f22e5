// The readers behind load_model (load/model.h), one per format.
#pragma once

#include <string>

#include "headlight/load/model.h"

namespace headlight::load {

Model load_hf_folder(const std::string& path);
Model load_gguf(const std::string& path);

}  // namespace headlight::load

// Block sizes of the ggml tensor types the GGUF reader reads (dequantize.cc has the formats).
#pragma once

#include <cstdint>

#include "headlight/io/gguf.h"

namespace headlight::io {

struct GgmlBlock {
  int64_t values = 0;  // elements per block (0: a type headlight does not read)
  int64_t bytes = 0;   // bytes per block
};
GgmlBlock ggml_block(GgmlType type);
bool ggml_type_supported(uint32_t type);

}  // namespace headlight::io

// libFuzzer target for the GGUF reader: any bytes must either parse into an index whose tensors
// lie inside the data and dequantise without reading past them, or throw headlight::Error; never
// crash, hang, allocate without bound or read out of bounds (AddressSanitizer and UBSan, run by
// scripts/run-fuzz).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "headlight/core/error.h"
#include "headlight/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto index = headlight::io::parse_gguf(std::span<const uint8_t>(data, size), "fuzz");
    // What the reader promises: every tensor's bytes lie within the file, and they dequantise.
    for (const auto& t : index.tensors) {
      if (index.data_start + t.offset + t.bytes > size) __builtin_trap();
      if (t.numel() <= (int64_t{1} << 16)) {
        std::vector<float> out(static_cast<size_t>(t.numel()));
        headlight::io::dequantize(t.type, data + index.data_start + t.offset, t.numel(),
                                  out.data());
      }
    }
  } catch (const headlight::Error&) {
  }
  return 0;
}

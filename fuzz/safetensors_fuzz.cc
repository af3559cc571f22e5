// libFuzzer target for the safetensors reader: any bytes must either parse into an index whose
// tensors lie inside the data, or throw headlight::Error; never crash, hang or read out of bounds
// (run under AddressSanitizer and UBSan by scripts/run-fuzz).

#include <cstddef>
#include <cstdint>
#include <span>

#include "headlight/core/error.h"
#include "headlight/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto index =
        headlight::io::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
    // What the reader promises: every tensor's bytes lie within the file.
    for (const auto& t : index.tensors)
      if (index.data_start + t.end > size || t.begin > t.end) __builtin_trap();
  } catch (const headlight::Error&) {
  }
  return 0;
}

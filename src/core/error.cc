#include "headlight/core/error.h"

namespace headlight {

std::string shape_string(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

void fail_allocation(const std::string& what, size_t bytes) {
  const double b = static_cast<double>(bytes);
  const std::string size = b >= 0x1p40   ? fmt::format("{:.1f} TiB", b / 0x1p40)
                           : b >= 0x1p30 ? fmt::format("{:.1f} GiB", b / 0x1p30)
                           : b >= 0x1p20 ? fmt::format("{:.1f} MiB", b / 0x1p20)
                                         : fmt::format("{:.1f} KiB", b / 0x1p10);
  throw OutOfMemory(fmt::format("{}: cannot allocate {}", what, size));
}

}  // namespace headlight

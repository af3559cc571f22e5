// headlight::Error: the one exception type for bad input and broken invariants.
//
// Messages name the argument and the shapes involved ("key: expected 4 dims (batch, heads, seq,
// dim), got [2, 3]"), so that a user can fix the call without reading our source.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace headlight {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

// "[2, 3, 4]"
std::string shape_string(std::span<const int64_t> shape);
inline std::string shape_string(const std::vector<int64_t>& shape) {
  return shape_string(std::span<const int64_t>(shape.data(), shape.size()));
}

// Throws Error with a formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Throws Error with the formatted message when `condition` is false.
template <typename... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace headlight

// headlight::Error: the one exception type for bad input and broken invariants.
//
// Messages name the argument and the shapes involved ("key: expected 4 dims (batch, heads, seq,
// dim), got [2, 3]"), so that a user can fix the call without reading our source.
#pragma once

#include <cstdint>
#include <new>
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

// An allocation that failed, with what was asked for ("Tensor [1, 8, 100000000, 64] bfloat16:
// cannot allocate 95.4 GiB"). A std::bad_alloc, so that callers that handle running out of memory
// (Python's MemoryError through pybind11) still do.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Throws OutOfMemory: "{what}: cannot allocate {bytes in KiB, MiB or GiB}".
[[noreturn]] void fail_allocation(const std::string& what, size_t bytes);

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

// A read-only memory map of a whole regular file, shared by the file readers of io/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace headlight::io {

class MappedFile {
 public:
  // Maps `path`; throws Error naming it when it cannot be opened, is not a regular file or cannot
  // be mapped. An empty file maps to an empty span.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace headlight::io

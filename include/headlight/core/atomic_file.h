// AtomicFile: a file written all at once or not at all. The bytes go to a temporary file beside
// `path` (same folder, so the rename stays on one file system); commit() flushes it to disk and
// renames it over `path`. A file that is never committed (an error, an exception) is removed, so a
// reader of `path` sees the old file or the whole new one, never a part. Used by every writer of
// the project: checkpoints, reports, heatmaps, .npy arrays.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace headlight {

class AtomicFile {
 public:
  // Throws Error naming `path` when it names a folder or its folder cannot take a new file.
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  // The open temporary file (for libraries that write to a FILE*).
  FILE* stream() { return file_; }
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Flushes, syncs and renames over the path; throws Error naming it (nothing written) on failure.
  void commit();

 private:
  std::string path_, tmp_;
  FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace headlight

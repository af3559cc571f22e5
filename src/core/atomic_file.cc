// AtomicFile (see headlight/core/atomic_file.h).

#include "headlight/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "headlight/core/error.h"

namespace headlight {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  const fs::path target(path_);
  std::error_code ec;
  check(!path_.empty(), "output path: empty");
  check(!fs::is_directory(target, ec), "{}: is a folder, not a file to write", path_);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string name = ".";  // (built by appends: GCC 12 warns falsely on "." + string)
  name += target.filename().string();
  name += ".tmp.XXXXXX";
  tmp_ = (dir / name).string();
  const int fd = ::mkstemp(tmp_.data());
  check(fd >= 0, "{}: cannot create a temporary file in {} ({})", path_, dir.string(),
        std::strerror(errno));
  // mkstemp creates the file 0600; give it the permissions a plain create would (0666 & ~umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp_.c_str());
    fail("{}: cannot open a temporary file ({})", path_, std::strerror(err));
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (file_) std::fclose(file_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  check(file_ != nullptr && !committed_, "{}: write after commit", path_);
  if (bytes == 0) return;
  if (std::fwrite(data, 1, bytes, file_) != bytes)
    fail("{}: writing failed ({}); nothing was written", path_, std::strerror(errno));
}

void AtomicFile::commit() {
  check(file_ != nullptr && !committed_, "{}: committed twice", path_);
  bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  int err = ok ? 0 : errno;
  if (std::fclose(file_) != 0 && ok) {
    ok = false;
    err = errno;
  }
  file_ = nullptr;
  if (ok && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp_.c_str());
    fail("{}: writing failed ({}); nothing was written", path_, std::strerror(err));
  }
  committed_ = true;
  // Make the rename itself durable.
  const std::filesystem::path target(path_);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace headlight

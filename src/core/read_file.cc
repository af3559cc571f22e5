// read_file (see headlight/core/read_file.h).

#include "headlight/core/read_file.h"

#include <fstream>
#include <sstream>

#include "headlight/core/error.h"

namespace headlight {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot be read", path);
  std::ostringstream buf;
  buf << in.rdbuf();
  check(!in.bad(), "{}: cannot be read", path);
  return buf.str();
}

}  // namespace headlight

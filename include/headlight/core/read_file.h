// The whole of a file as bytes: the one reader of small text files (configs, tokenizer JSON, data
// files) for the layers that parse them. Large binary files are memory-mapped instead (io/).
#pragma once

#include <string>

namespace headlight {

// Throws Error "<path>: cannot be read" when the file cannot be opened or read.
std::string read_file(const std::string& path);

}  // namespace headlight

// The process's resident memory, for the benchmarks' memory figures (Linux /proc).
#pragma once

#include <fstream>
#include <string>

namespace headlight::bench {

// A field of /proc/self/status in bytes ("VmRSS": resident now, "VmHWM": peak resident), 0 when
// it cannot be read.
inline double resident_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  for (std::string line; std::getline(status, line);)
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(prefix.size())) * 1024.0;
  return 0;
}

// Resets VmHWM to the current resident set (Linux: writing 5 to clear_refs), so that the peak
// measured afterwards belongs to what runs next.
inline void reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

}  // namespace headlight::bench

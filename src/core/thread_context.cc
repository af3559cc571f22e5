#include "headlight/core/thread_context.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "headlight/core/error.h"

namespace headlight {

ScratchArena::~ScratchArena() {
  std::free(data_);
}

float* ScratchArena::floats(size_t count) {
  const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  if (bytes > bytes_) {
    std::free(data_);
    data_ = std::aligned_alloc(64, bytes);
    if (!data_) {
      bytes_ = 0;
      fail_allocation("scratch arena", bytes);
    }
    bytes_ = bytes;
  }
  return static_cast<float*>(data_);
}

int ThreadContext::resolved_threads(int num_threads) {
  return num_threads > 0 ? num_threads : std::max(1, omp_get_max_threads());
}

ThreadContext::ThreadContext(int num_threads) : num_threads_(resolved_threads(num_threads)) {
  scratch_.reserve(static_cast<size_t>(num_threads_));
  for (int i = 0; i < num_threads_; ++i) scratch_.push_back(std::make_unique<ScratchArena>());
}

std::vector<ThreadContext*> ThreadContext::singles() {
  while (singles_.size() < static_cast<size_t>(num_threads_))
    singles_.push_back(std::make_unique<ThreadContext>(1));
  std::vector<ThreadContext*> out;
  for (const auto& c : singles_) out.push_back(c.get());
  return out;
}

Range ThreadContext::partition(int64_t n, int parts, int index) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return Range{begin, begin + base + (index < extra ? 1 : 0)};
}

OmpThreadsGuard::OmpThreadsGuard(int num_threads) : previous_(omp_get_max_threads()) {
  omp_set_num_threads(std::max(1, num_threads));
}

OmpThreadsGuard::~OmpThreadsGuard() {
  omp_set_num_threads(previous_);
}

}  // namespace headlight

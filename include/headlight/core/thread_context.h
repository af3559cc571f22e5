// ThreadContext: how many threads a call may use, a deterministic partition of work among them, and
// per-worker scratch memory kept across calls.
//
// There is no global pool: a caller makes a ThreadContext and passes it down. Work is split into
// contiguous ranges that depend only on (n, number of parts), so any result that is reduced in a
// fixed order is bitwise the same for every thread count.
#pragma once

#include <omp.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace headlight {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Per-worker scratch: a 64-byte aligned buffer that only grows, so that repeated calls do not touch
// fresh pages (the first touch of a page costs microseconds on these virtual machines).
class ScratchArena {
 public:
  ScratchArena() = default;
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;
  ~ScratchArena();
  // At least `count` floats, 64-byte aligned; valid until the next call to floats().
  float* floats(size_t count);
  // Bytes held.
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class ThreadContext {
 public:
  // num_threads <= 0 means "all the hardware threads OpenMP reports".
  explicit ThreadContext(int num_threads = 0);
  // The thread count a context made with num_threads has (OpenMP's, as of now, for <= 0).
  static int resolved_threads(int num_threads);

  int num_threads() const { return num_threads_; }

  // Part `index` of `n` items split into `parts` contiguous, near-equal ranges.
  static Range partition(int64_t n, int parts, int index);

  // Runs fn(range, worker) for each worker's part of [0, n), in parallel.
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    const int parts = static_cast<int>(std::min<int64_t>(num_threads_, std::max<int64_t>(n, 1)));
    if (parts <= 1) {
      fn(Range{0, n}, 0);
      return;
    }
#pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int w = 0; w < parts; ++w) fn(partition(n, parts, w), w);
  }

  // Runs fn(item, worker) for every item of [0, n), handing items to threads as they free up.
  // Use it only when each item's result is computed by one thread in a fixed order (then the
  // results do not depend on which thread took which item).
  template <typename Fn>
  void parallel_items(int64_t n, Fn&& fn) {
    const int parts = static_cast<int>(std::min<int64_t>(num_threads_, std::max<int64_t>(n, 1)));
    if (parts <= 1) {
      for (int64_t i = 0; i < n; ++i) fn(i, 0);
      return;
    }
#pragma omp parallel num_threads(parts)
    {
      const int worker = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n; ++i) fn(i, worker);
    }
  }

  ScratchArena& scratch(int worker) {
    return *scratch_[static_cast<size_t>(worker)];
  }
  // One arena shared by all workers (for data packed once and read by every thread).
  ScratchArena& shared_scratch() {
    return shared_;
  }
  // Bytes held by all the arenas.
  size_t scratch_bytes() const {
    size_t total = shared_.bytes();
    for (const auto& s : scratch_) total += s->bytes();
    return total;
  }

 private:
  int num_threads_;
  std::vector<std::unique_ptr<ScratchArena>> scratch_;
  ScratchArena shared_;
};

// Sets OpenMP's thread count for libraries that read it (oneDNN) for the lifetime of the guard,
// and restores the previous value afterwards.
class OmpThreadsGuard {
 public:
  explicit OmpThreadsGuard(int num_threads);
  ~OmpThreadsGuard();
  OmpThreadsGuard(const OmpThreadsGuard&) = delete;
  OmpThreadsGuard& operator=(const OmpThreadsGuard&) = delete;

 private:
  int previous_;
};

}  // namespace headlight

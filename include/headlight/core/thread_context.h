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
#include <exception>
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

  // Runs fn(part, ctx) for every part of [0, n), each part whole on one thread. When n is a
  // multiple of the thread count (and there is more than one thread), worker w runs parts w,
  // w + T, w + 2T, … in turn on a single-thread context of its own (singles(): kept, with its
  // scratch), so that each part's data stays in its core's caches from start to end (between the
  // cores of a virtual machine data can cost 3× as much to read: a part's activations, written and
  // read again, then never cross); otherwise the parts run in turn on this context. fn must give
  // the same result on any context (every operation here does), so the results do not depend on
  // the thread count. An exception in a part is rethrown here, after every worker has stopped.
  template <typename Fn>
  void parallel_parts(int64_t n, Fn&& fn) {
    const int t = num_threads_;
    if (t <= 1 || n < t || n % t != 0) {
      for (int64_t i = 0; i < n; ++i) fn(i, *this);
      return;
    }
    const std::vector<ThreadContext*> ctx = singles();
    std::vector<std::exception_ptr> errors(static_cast<size_t>(t));
#pragma omp parallel num_threads(t)
    {
      const int w = omp_get_thread_num();
      try {
        for (int64_t i = w; i < n; i += t) fn(i, *ctx[static_cast<size_t>(w)]);
      } catch (...) {
        errors[static_cast<size_t>(w)] = std::current_exception();
      }
    }
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }
  // One single-thread context per worker (made on first use, then kept with their scratch).
  std::vector<ThreadContext*> singles();

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
    for (const auto& c : singles_) total += c->scratch_bytes();
    return total;
  }

 private:
  int num_threads_;
  std::vector<std::unique_ptr<ScratchArena>> scratch_;
  ScratchArena shared_;
  std::vector<std::unique_ptr<ThreadContext>> singles_;
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

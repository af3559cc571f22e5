#include "headlight/core/timing.h"

#include <algorithm>
#include <chrono>

namespace headlight {

Timing time_runs(const std::function<void()>& fn, int warmup, int runs) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) fn();
  Timing t;
  for (int i = 0; i < std::max(1, runs); ++i) {
    const auto t0 = Clock::now();
    fn();
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::vector<double> sorted = t.seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  t.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  t.min = sorted.front();
  return t;
}

}  // namespace headlight

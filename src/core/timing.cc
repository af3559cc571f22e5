#include "headlight/core/timing.h"

#include <algorithm>
#include <chrono>

namespace headlight {

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Timing time_runs(const std::function<void()>& fn, int warmup, int runs,
                 const std::function<void()>& between) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) fn();
  Timing t;
  for (int i = 0; i < std::max(1, runs); ++i) {
    const auto t0 = Clock::now();
    fn();
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (between) between();
  }
  t.median = median_of(t.seconds);
  t.min = *std::min_element(t.seconds.begin(), t.seconds.end());
  return t;
}

}  // namespace headlight

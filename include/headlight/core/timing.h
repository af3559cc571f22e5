// Wall-clock timing of repeated runs, reported as a median (the machines are shared and noisy).
#pragma once

#include <functional>
#include <vector>

namespace headlight {

struct Timing {
  std::vector<double> seconds;  // one per timed run, in run order
  double median = 0;
  double min = 0;
};

// Runs fn `warmup` times untimed, then `runs` times timed (at least 1).
Timing time_runs(const std::function<void()>& fn, int warmup, int runs);

}  // namespace headlight

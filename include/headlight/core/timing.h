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

// Runs fn `warmup` times untimed, then `runs` times timed (at least 1); `between`, when given,
// runs untimed after each timed run (a measurement interleaved with the runs).
Timing time_runs(const std::function<void()>& fn, int warmup, int runs,
                 const std::function<void()>& between = {});

// The median of a non-empty list.
double median_of(std::vector<double> values);

}  // namespace headlight

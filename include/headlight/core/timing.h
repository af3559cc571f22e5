// Wall-clock timing of repeated runs, reported as a median (the machines are shared and noisy).
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace headlight {

struct Timing {
  std::vector<double> seconds;  // one per timed run, in run order
  double median = 0;
  double min = 0;
  // Over the timed runs (and `between`), the cores' worth of time that other processes kept busy
  // and that the hypervisor gave to other guests (steal), from /proc/stat; negative when it could
  // not be read. The figures are 10 ms ticks: read them over runs of a tenth of a second or more.
  double other_cores = -1;
  double steal_cores = -1;
};

// Machine-wide and own CPU time at one moment (/proc/stat and getrusage), to tell what else ran.
struct CpuTimes {
  double wall = 0;     // steady clock, seconds
  double busy = 0;     // every CPU's user, nice, system, irq and softirq time, seconds
  double steal = 0;    // every CPU's steal time, seconds
  double own = 0;      // this process's user and system time, seconds
  bool valid = false;  // /proc/stat was read
};
CpuTimes cpu_times();
// Between two samples: {cores' worth of other processes' time, of steal}; {-1, -1} if either
// sample is not valid.
std::pair<double, double> other_load(const CpuTimes& from, const CpuTimes& to);

// Runs fn `warmup` times untimed, then `runs` times timed (at least 1); `between`, when given,
// runs untimed after each timed run (a measurement interleaved with the runs).
Timing time_runs(const std::function<void()>& fn, int warmup, int runs,
                 const std::function<void()>& between = {});

// The median of a non-empty list.
double median_of(std::vector<double> values);

}  // namespace headlight

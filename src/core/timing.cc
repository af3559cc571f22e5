#include "headlight/core/timing.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

namespace headlight {

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

CpuTimes cpu_times() {
  CpuTimes t;
  t.wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0)
    t.own = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
            1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  // The first line sums every CPU: cpu user nice system idle iowait irq softirq steal ... (ticks;
  // guest time is inside user).
  std::ifstream stat("/proc/stat");
  std::string line, label;
  if (!std::getline(stat, line)) return t;
  std::istringstream fields(line);
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(fields >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq) ||
      label != "cpu")
    return t;
  fields >> steal;  // absent on old kernels: 0
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) return t;
  t.busy = (user + nice + system + irq + softirq) / static_cast<double>(hz);
  t.steal = steal / static_cast<double>(hz);
  t.valid = true;
  return t;
}

std::pair<double, double> other_load(const CpuTimes& from, const CpuTimes& to) {
  const double wall = to.wall - from.wall;
  if (!from.valid || !to.valid || wall <= 0) return {-1.0, -1.0};
  const double others = (to.busy - from.busy) - (to.own - from.own);
  return {std::max(0.0, others / wall), std::max(0.0, (to.steal - from.steal) / wall)};
}

Timing time_runs(const std::function<void()>& fn, int warmup, int runs,
                 const std::function<void()>& between) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) fn();
  Timing t;
  const CpuTimes start = cpu_times();
  for (int i = 0; i < std::max(1, runs); ++i) {
    const auto t0 = Clock::now();
    fn();
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (between) between();
  }
  std::tie(t.other_cores, t.steal_cores) = other_load(start, cpu_times());
  t.median = median_of(t.seconds);
  t.min = *std::min_element(t.seconds.begin(), t.seconds.end());
  return t;
}

}  // namespace headlight

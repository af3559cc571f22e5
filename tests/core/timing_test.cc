#include "headlight/core/timing.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace headlight {
namespace {

TEST(Timing, TimesEachRunAndMeasuresBetweenThem) {
  int calls = 0, betweens = 0;
  const Timing t = time_runs([&] { ++calls; }, 3, 5, [&] { ++betweens; });
  EXPECT_EQ(calls, 8);  // 3 untimed, 5 timed
  EXPECT_EQ(betweens, 5);
  ASSERT_EQ(t.seconds.size(), 5u);
  EXPECT_LE(t.min, t.median);
  EXPECT_EQ(median_of({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median_of({4.0, 1.0, 2.0, 3.0}), 2.5);
}

TEST(Timing, OtherLoadIsTheMachinesBusyTimeLessOwn) {
  // 4 s of busy CPU time over 2 s of wall time, 1 of them this process's: 1.5 cores of others;
  // steal 0.5 s over 2 s.
  const CpuTimes from{.wall = 10, .busy = 100, .steal = 1, .own = 5, .valid = true};
  const CpuTimes to{.wall = 12, .busy = 104, .steal = 1.5, .own = 6, .valid = true};
  const auto [others, steal] = other_load(from, to);
  EXPECT_DOUBLE_EQ(others, 1.5);
  EXPECT_DOUBLE_EQ(steal, 0.25);
  EXPECT_EQ(other_load(CpuTimes{}, to), std::make_pair(-1.0, -1.0));  // /proc/stat not read
}

TEST(Timing, OtherLoadSeesAnotherProcessSpinning) {
  // A child process spins while this one sleeps: it shows as about one core of others' time.
  // (Other tests running beside this one can only add to it.)
  const CpuTimes from = cpu_times();
  ASSERT_TRUE(from.valid) << "/proc/stat was not read";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
    volatile unsigned spin = 0;
    while (std::chrono::steady_clock::now() < end) spin = spin + 1;
    _exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const CpuTimes to = cpu_times();
  int status = 0;
  waitpid(child, &status, 0);
  const auto [others, steal] = other_load(from, to);
  EXPECT_GE(others, 0.4) << "the spinning child was not seen";
  EXPECT_GE(steal, 0.0);
}

}  // namespace
}  // namespace headlight

// HEADLIGHT_ISA's restrictions (force_isa): which bf16 instructions beyond Highway's targets each
// name leaves to the kernels, and the error for an unknown name; the threads' hand-off latency.

#include "headlight/core/cpu_info.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "headlight/core/error.h"

namespace headlight {
namespace {

TEST(ForceIsa, EachNameAllowsItsBf16Instructions) {
  // avx3_bf16: AVX-512 BF16 but not AMX (the vdpbf16ps kernels, on AMX machines too); avx3 and
  // below: neither; best: both (what the CPU has is asked elsewhere: cpu_has_bf16_dot,
  // amx_available).
  force_isa("avx3_bf16");
  EXPECT_TRUE(native_bf16_allowed());
  EXPECT_FALSE(amx_allowed());
  for (const char* isa : {"avx3", "avx2", "sse4", "scalar"}) {
    force_isa(isa);
    EXPECT_FALSE(native_bf16_allowed()) << isa;
    EXPECT_FALSE(amx_allowed()) << isa;
  }
  force_isa("best");
  EXPECT_TRUE(native_bf16_allowed());
  EXPECT_TRUE(amx_allowed());
}

TEST(ForceIsa, UnknownNamesAreRefusedByName) {
  try {
    force_isa("avx9");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HEADLIGHT_ISA: unknown instruction set 'avx9'"),
              std::string::npos)
        << e.what();
  }
  force_isa("best");
}

TEST(Handoff, TwoThreadsHandALineOverAndOneThreadHasNoOne) {
  // A few trips only: under ctest -j the other thread may wait for a time slice.
  ThreadContext one(1), two(2);
  EXPECT_EQ(measure_handoff_ns(one, 20), 0.0);
  EXPECT_EQ(measure_handoff_ns(two, 0), 0.0);
  const double ns = measure_handoff_ns(two, 20);
  EXPECT_TRUE(std::isfinite(ns));
  EXPECT_GT(ns, 0.0);
}

}  // namespace
}  // namespace headlight

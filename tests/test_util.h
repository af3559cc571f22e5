// Helpers shared by the GoogleTest suites: seeded random tensors and error-message checks.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/core/tensor.h"

namespace headlight::testing {

// A float32 tensor with entries uniform in [-1, 1), from `seed`.
inline Tensor random_tensor(Shape shape, uint64_t seed) {
  Tensor t(DType::f32, std::move(shape));
  Generator g(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = g.uniform(-1, 1);
  return t;
}

// Expects fn() to throw headlight::Error whose message contains every one of `needles`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected headlight::Error";
  } catch (const Error& e) {
    for (const char* n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
  }
}

}  // namespace headlight::testing

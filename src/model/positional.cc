// Positional encodings: the sinusoidal table, rotary embeddings and ALiBi slopes.

#include "headlight/model/positional.h"

#include <cmath>

namespace headlight::model {

std::vector<float> sinusoidal_table(int64_t positions, int64_t dim) {
  std::vector<float> t(static_cast<size_t>(positions * dim));
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; 2 * i < dim; ++i) {
      const double angle = static_cast<double>(p) /
                           std::pow(10000.0, static_cast<double>(2 * i) / static_cast<double>(dim));
      t[static_cast<size_t>(p * dim + 2 * i)] = static_cast<float>(std::sin(angle));
      if (2 * i + 1 < dim)
        t[static_cast<size_t>(p * dim + 2 * i + 1)] = static_cast<float>(std::cos(angle));
    }
  return t;
}

RopeTable rope_table(int64_t positions, int64_t head_dim, float base) {
  RopeTable t;
  t.positions = positions;
  t.half = head_dim / 2;
  t.cos.resize(static_cast<size_t>(positions * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t j = 0; j < t.half; ++j) {
      const double inv_freq = std::pow(
          static_cast<double>(base), -2.0 * static_cast<double>(j) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos[static_cast<size_t>(p * t.half + j)] = static_cast<float>(std::cos(angle));
      t.sin[static_cast<size_t>(p * t.half + j)] = static_cast<float>(std::sin(angle));
    }
  return t;
}

void apply_rope(const RopeTable& t, const RopeApply& a, float* x) {
  const int64_t half = t.half, hd = 2 * half;
  const float sign = a.inverse ? -1.0f : 1.0f;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t pos = a.pos0 + r % a.period;
    const float* c = t.cos.data() + pos * half;
    const float* s = t.sin.data() + pos * half;
    for (int64_t h = 0; h < a.heads; ++h) {
      float* v = x + r * a.ld + h * hd;
      for (int64_t j = 0; j < half; ++j) {
        const float x1 = v[j], x2 = v[j + half], sj = sign * s[j];
        v[j] = x1 * c[j] - x2 * sj;
        v[j + half] = x2 * c[j] + x1 * sj;
      }
    }
  }
}

std::vector<float> alibi_slopes(int64_t n) {
  auto power_of_two = [](int64_t m) {
    std::vector<float> s;
    for (int64_t h = 1; h <= m; ++h)
      s.push_back(static_cast<float>(
          std::pow(2.0, -8.0 * static_cast<double>(h) / static_cast<double>(m))));
    return s;
  };
  int64_t m = 1;
  while (m * 2 <= n) m *= 2;
  std::vector<float> slopes = power_of_two(m);
  if (m < n) {
    const std::vector<float> extra = power_of_two(2 * m);
    for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < n; i += 2)
      slopes.push_back(extra[static_cast<size_t>(i)]);
  }
  return slopes;
}

}  // namespace headlight::model

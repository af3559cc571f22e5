// Positional encodings (docs/design.md §2 "Model conventions"):
//   learned     a trained table wpe[block_size, n_embd] added to the token embeddings;
//   sinusoidal  PE[p, 2i] = sin(p / 10000^(2i/n_embd)), PE[p, 2i+1] = cos(…), added likewise;
//   rope        q and k of every head rotated in the rotate-half form: for j < d/2 the pair
//               (x[j], x[j + d/2]) turns by the angle p · base^(−2j/d);
//   alibi       a bias −slope_h · (i − j) on the scores, in the attention kernel;
//   none        nothing (a causal decoder still sees order through its mask).
#pragma once

#include <cstdint>
#include <vector>

namespace headlight::model {

// [positions, dim] row-major, the sinusoidal table.
std::vector<float> sinusoidal_table(int64_t positions, int64_t dim);

// cos and sin of the rotary angles, [positions, head_dim / 2] each.
struct RopeTable {
  int64_t positions = 0;
  int64_t half = 0;
  std::vector<float> cos, sin;
};
RopeTable rope_table(int64_t positions, int64_t head_dim, float base);

// Rotates `heads` heads of head_dim floats in each of `rows` rows: head h of row r starts at
// x + r·ld + h·head_dim and sits at position pos0 + r mod period. inverse = true rotates by the
// negative angle (the backward: the transpose of a rotation).
struct RopeApply {
  int64_t rows = 0;
  int64_t period = 0;  // rows are [batch, period]
  int64_t pos0 = 0;    // position of the first row of each period
  int64_t ld = 0;
  int64_t heads = 0;
  bool inverse = false;
};
void apply_rope(const RopeTable& t, const RopeApply& a, float* x);

// ALiBi slopes for n heads: 2^(−8h/n) for h = 1..n when n is a power of two; otherwise those of
// the power of two m below n, then every other slope of 2m (Press et al.).
std::vector<float> alibi_slopes(int64_t n);

}  // namespace headlight::model

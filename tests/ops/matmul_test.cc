#include "headlight/ops/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "headlight/core/bf16.h"
#include "headlight/core/error.h"
#include "headlight/core/rng.h"

namespace headlight::ops {
namespace {

std::vector<float> random_vector(size_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = g.uniform(-1.0f, 1.0f);
  return v;
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

TEST(Matmul, MatchesNaiveProductForEveryTransposeAndOddShapes) {
  ThreadContext ctx(2);
  for (Case c : {Case{.m = 1, .n = 1, .k = 1, .ta = false, .tb = false},
                 Case{.m = 7, .n = 13, .k = 5, .ta = false, .tb = true},
                 Case{.m = 33, .n = 17, .k = 65, .ta = true, .tb = false},
                 Case{.m = 64, .n = 31, .k = 19, .ta = true, .tb = true},
                 Case{.m = 3, .n = 250, .k = 129, .ta = false, .tb = false}}) {
    // Stored shapes: a is m×k (or k×m when transposed), b is k×n (or n×k); pad leading dims by 3.
    const int64_t lda = (c.ta ? c.m : c.k) + 3, ldb = (c.tb ? c.k : c.n) + 3, ldc = c.n + 2;
    auto a = random_vector(static_cast<size_t>((c.ta ? c.k : c.m) * lda), 1);
    auto b = random_vector(static_cast<size_t>((c.tb ? c.n : c.k) * ldb), 2);
    std::vector<float> out(static_cast<size_t>(c.m * ldc), 0.5f);
    matmul(ctx, {a.data(), c.m, c.k, lda, c.ta}, {b.data(), c.k, c.n, ldb, c.tb},
           {out.data(), ldc, 2.0f, 1.0f});
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double av = c.ta ? a[p * lda + i] : a[i * lda + p];
          const double bv = c.tb ? b[j * ldb + p] : b[p * ldb + j];
          s += av * bv;
        }
        ASSERT_NEAR(out[i * ldc + j], 2.0 * s + 0.5, 1e-4 * (1 + std::fabs(s)))
            << c.m << "x" << c.n << "x" << c.k << " at " << i << "," << j;
      }
    }
  }
}

TEST(Matmul, Bf16InputsMatchTheExactProductOfTheirValues) {
  // Products of bf16 values are exact in fp32; only the fp32 accumulation rounds. Small and large
  // shapes (the large ones take AMX or AVX-512 BF16 kernels where the CPU has them), each
  // transpose, odd leading dims, alpha and beta, a bias with an activation.
  ThreadContext ctx(2);
  for (Case c : {Case{.m = 1, .n = 3, .k = 5, .ta = false, .tb = true},
                 Case{.m = 33, .n = 17, .k = 65, .ta = true, .tb = false},
                 Case{.m = 200, .n = 96, .k = 300, .ta = false, .tb = true},
                 Case{.m = 130, .n = 250, .k = 129, .ta = true, .tb = true}}) {
    const int64_t lda = (c.ta ? c.m : c.k) + 3, ldb = (c.tb ? c.k : c.n) + 3, ldc = c.n + 2;
    auto a = random_vector(static_cast<size_t>((c.ta ? c.k : c.m) * lda), 3);
    auto b = random_vector(static_cast<size_t>((c.tb ? c.n : c.k) * ldb), 4);
    std::vector<bf16> a16(a.size()), b16(b.size());
    to_bf16(a.data(), a16.data(), a.size());
    to_bf16(b.data(), b16.data(), b.size());
    std::vector<float> out(static_cast<size_t>(c.m * ldc), 0.5f);
    matmul(ctx, {.rows = c.m, .cols = c.k, .ld = lda, .transposed = c.ta, .bf16 = a16.data()},
           {.rows = c.k, .cols = c.n, .ld = ldb, .transposed = c.tb, .bf16 = b16.data()},
           {out.data(), ldc, 2.0f, 1.0f});
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double av = to_float(c.ta ? a16[p * lda + i] : a16[i * lda + p]);
          const double bv = to_float(c.tb ? b16[j * ldb + p] : b16[p * ldb + j]);
          s += av * bv;
          mag += std::fabs(av * bv);
        }
        ASSERT_NEAR(out[i * ldc + j], 2.0 * s + 0.5, 1e-5 * (1 + 2 * mag))
            << c.m << "x" << c.n << "x" << c.k << " at " << i << "," << j;
      }
  }
  float x = 0;
  const bf16 h{};
  EXPECT_THROW(matmul(ctx, {&x, 1, 1, 1}, {.rows = 1, .cols = 1, .ld = 1, .bf16 = &h}, {&x, 1}),
               Error);
}

TEST(Matmul, Bf16OutputIsTheFloat32OutputRoundedOnce) {
  // The product's epilogue rounds to bf16 (nearest even) after the bias: the float32 output of the
  // same product rounded once, element for element; K = 0 gives zeros; beta or a float32 output
  // beside it are refused by name.
  ThreadContext ctx(2);
  for (const int64_t k : {int64_t{0}, int64_t{64}, int64_t{129}}) {
    const int64_t m = 200, n = 96, ldc = n + 5;
    auto a = random_vector(static_cast<size_t>(m * std::max<int64_t>(k, 1)), 7);
    auto w = random_vector(static_cast<size_t>(n * std::max<int64_t>(k, 1)), 8);
    auto bias = random_vector(static_cast<size_t>(n), 9);
    std::vector<bf16> a16(a.size()), w16(w.size());
    to_bf16(a.data(), a16.data(), a.size());
    to_bf16(w.data(), w16.data(), w.size());
    const LinearShape s{.rows = m, .in_features = k, .out_features = n};
    std::vector<float> y(static_cast<size_t>(m * ldc));
    std::vector<bf16> y16(y.size(), to_bf16(7.0f));
    if (k > 0) linear_forward_bf16(ctx, s, a16.data(), k, w16.data(), bias.data(), y.data(), ldc);
    linear_forward_bf16_rounded(ctx, s, a16.data(), k, w16.data(), k > 0 ? bias.data() : nullptr,
                                y16.data(), ldc);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(y16[i * ldc + j].bits, to_bf16(k > 0 ? y[i * ldc + j] : 0.0f).bits)
            << k << " at " << i << "," << j;
  }
  float x = 0;
  bf16 h{};
  const MatrixArg one{.rows = 1, .cols = 1, .ld = 1, .bf16 = &h};
  for (const OutputArg& bad : {OutputArg{.ld = 1, .beta = 1.0f, .data16 = &h},
                               OutputArg{.data = &x, .ld = 1, .data16 = &h}}) {
    try {
      matmul(ctx, one, one, bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bf16 output"), std::string::npos) << e.what();
    }
  }
}

TEST(Matmul, MultiplyingEpilogueIsTheProductTimesTheFactorsRoundedOnce) {
  // c = (a·b + bias) ⊙ m in the epilogue, within float32 accumulation of the exact value; with
  // float32 inputs (the product's path for large shapes, dnnl_sgemm's for small ones) the plain
  // product's own value times m, element for element (bf16 kernels may add in another order when
  // the epilogue multiplies); a bf16 output is that epilogue's float32 value rounded once. m has
  // its own row stride; beta is refused by name.
  ThreadContext ctx(2);
  for (const bool bf16_in : {false, true})
    for (const int64_t m : {int64_t{3}, int64_t{130}}) {
      const int64_t n = 70, k = 48, ldc = n + 3, ldm = n + 9;
      auto a = random_vector(static_cast<size_t>(m * k), 21);
      auto w = random_vector(static_cast<size_t>(n * k), 22);
      auto bias = random_vector(static_cast<size_t>(n), 23);
      auto f = random_vector(static_cast<size_t>(m * ldm), 24);
      std::vector<bf16> a16(a.size()), w16(w.size());
      to_bf16(a.data(), a16.data(), a.size());
      to_bf16(w.data(), w16.data(), w.size());
      const MatrixArg am = bf16_in ? MatrixArg{.rows = m, .cols = k, .ld = k, .bf16 = a16.data()}
                                   : MatrixArg{.data = a.data(), .rows = m, .cols = k, .ld = k};
      const MatrixArg bm =
          bf16_in ? MatrixArg{.rows = k, .cols = n, .ld = k, .transposed = true, .bf16 = w16.data()}
                  : MatrixArg{.data = w.data(), .rows = k, .cols = n, .ld = k, .transposed = true};
      std::vector<float> plain(static_cast<size_t>(m * ldc)), got(plain.size());
      matmul(ctx, am, bm, {.data = plain.data(), .ld = ldc, .bias = bias.data()});
      matmul(ctx, am, bm,
             {.data = got.data(),
              .ld = ldc,
              .bias = bias.data(),
              .multiply = f.data(),
              .multiply_ld = ldm});
      std::vector<bf16> got16(plain.size());
      if (bf16_in)
        matmul(ctx, am, bm,
               {.ld = ldc,
                .bias = bias.data(),
                .data16 = got16.data(),
                .multiply = f.data(),
                .multiply_ld = ldm});
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          // The exact (a·b + bias) ⊙ m of the values used; float32 inputs: the plain product's
          // own float32 value times m, bit for bit.
          double sum = bias[j], mag = std::fabs(bias[j]);
          for (int64_t p = 0; p < k; ++p) {
            const double t =
                bf16_in ? static_cast<double>(to_float(a16[i * k + p])) * to_float(w16[j * k + p])
                        : static_cast<double>(a[i * k + p]) * w[j * k + p];
            sum += t;
            mag += std::fabs(t);
          }
          const float fm = f[i * ldm + j], value = got[i * ldc + j];
          ASSERT_NEAR(value, sum * fm, 1e-6 * (1 + mag))
              << bf16_in << " " << m << " at " << i << "," << j;
          if (!bf16_in) {
            ASSERT_EQ(value, plain[i * ldc + j] * fm) << m << " at " << i << "," << j;
          } else {  // a bf16 output: the same epilogue's float32 value rounded once
            ASSERT_EQ(got16[i * ldc + j].bits, to_bf16(value).bits) << i << "," << j;
          }
        }
    }
  float x = 0, one_f = 1;
  const MatrixArg one{.data = &one_f, .rows = 1, .cols = 1, .ld = 1};
  try {
    matmul(ctx, one, one,
           {.data = &x, .ld = 1, .beta = 1.0f, .multiply = &one_f, .multiply_ld = 1});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiplying epilogue"), std::string::npos) << e.what();
  }
}

TEST(Matmul, APackedWeightStoreHandsOutAlignedMemoryInChunks) {
  // Copies follow one another in a chunk, 64-byte aligned, and stay where they are when later
  // ones open a new chunk; one larger than a chunk gets a chunk of its own; clear() drops all.
  PackedWeightStore store;
  EXPECT_EQ(store.reserved(), 0u);
  std::byte* a = store.take(100);
  std::byte* b = store.take(64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(b, a + 128);
  EXPECT_EQ(store.reserved(), PackedWeightStore::kChunkBytes);
  std::memset(a, 0x5a, 100);
  std::byte* big = store.take(PackedWeightStore::kChunkBytes + 1);  // a chunk of its own
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % 64, 0u);
  EXPECT_EQ(store.reserved(), 2 * PackedWeightStore::kChunkBytes + 64);
  big[PackedWeightStore::kChunkBytes] = std::byte{1};
  std::byte* c = store.take(PackedWeightStore::kChunkBytes - 64);  // does not fit after big
  EXPECT_EQ(store.reserved(), 3 * PackedWeightStore::kChunkBytes + 64);
  c[0] = std::byte{2};
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a[i], std::byte{0x5a});
  EXPECT_EQ(store.take(64), c + PackedWeightStore::kChunkBytes - 64);  // the rest of c's chunk
  store.clear();
  EXPECT_EQ(store.reserved(), 0u);
}

TEST(Matmul, APackedWeightKeepsEachProductApart) {
  // A packed weight keeps the products made against it (PackedWeight::Impl::products), found
  // again by everything they were made for. Twelve products that differ from each other in one
  // thing each (rows, a's leading dimension or orientation, c's, alpha, beta, bias, activation,
  // bf16 output, an element-wise multiplier), run twice in turn on one weight (more than it
  // keeps, so the second round finds some and makes the others again), give the bits each gives
  // on a weight of its own; so do they from a one-thread context after a two-thread one.
  ThreadContext ctx(2);
  const int64_t in = 40, out = 24, maxr = 3, ld = 64;
  auto w = random_vector(static_cast<size_t>(out * in), 21);
  std::vector<bf16> w16(w.size());
  to_bf16(w.data(), w16.data(), w.size());
  auto x = random_vector(static_cast<size_t>(ld * ld), 22);
  std::vector<bf16> x16(x.size());
  to_bf16(x.data(), x16.data(), x.size());
  const auto bias = random_vector(static_cast<size_t>(out), 23);
  const auto mul = random_vector(static_cast<size_t>(maxr * ld), 24);
  struct Product {
    int64_t rows, lda;
    bool ta;
    int64_t ldc;
    float alpha, beta;
    bool bias, gelu, out16, multiply;
  };
  const std::vector<Product> products = {
      {1, in, false, out, 1, 0, false, false, false, false},
      {3, in, false, out, 1, 0, false, false, false, false},
      {3, in + 5, false, out, 1, 0, false, false, false, false},
      {2, ld, true, out, 1, 0, false, false, false, false},
      {3, in, false, out + 7, 1, 0, false, false, false, false},
      {1, in, false, out, 0.5f, 0, false, false, false, false},
      {1, in, false, out, 1, 1, false, false, false, false},
      {1, in, false, out, 1, 0, true, false, false, false},
      {1, in, false, out, 1, 0, false, true, false, false},
      {1, in, false, out, 1, 0, false, false, true, false},
      {1, in, false, out, 1, 0, false, false, false, true},
      {3, in, false, out + 7, 2, 0, true, true, true, true},
  };
  auto run = [&](const PackedWeight& packed, const Product& q, ThreadContext& on) {
    std::vector<float> y(static_cast<size_t>(maxr * ld), 0.25f);
    std::vector<bf16> y16(y.size(), to_bf16(0.25f));
    matmul(ctx, {.rows = q.rows, .cols = in, .ld = q.lda, .transposed = q.ta, .bf16 = x16.data()},
           {.rows = in, .cols = out, .packed = &packed},
           {.data = q.out16 ? nullptr : y.data(),
            .ld = q.ldc,
            .alpha = q.alpha,
            .beta = q.beta,
            .bias = q.bias ? bias.data() : nullptr,
            .activation = q.gelu ? std::optional<Activation>{Activation::gelu_erf} : std::nullopt,
            .data16 = q.out16 ? y16.data() : nullptr,
            .multiply = q.multiply ? mul.data() : nullptr,
            .multiply_ld = q.multiply ? ld : 0});
    for (size_t i = 0; i < y.size(); ++i) y[i] += to_float(y16[i]);  // both compared
    return y;
  };
  std::vector<std::vector<float>> alone;
  for (const Product& q : products) alone.push_back(run(PackedWeight(w16.data(), in, out), q, ctx));
  const PackedWeight shared(w16.data(), in, out);
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < products.size(); ++i)
      ASSERT_EQ(run(shared, products[i], ctx), alone[i]) << "product " << i << ", round " << round;
  // The same weight from a one-thread context, then from two again: products made for each.
  ThreadContext one(1);
  std::vector<std::vector<float>> alone_one;
  for (const Product& q : products)
    alone_one.push_back(run(PackedWeight(w16.data(), in, out), q, one));
  for (size_t i = 0; i < products.size(); ++i)
    ASSERT_EQ(run(shared, products[i], one), alone_one[i]) << "product " << i << ", one thread";
  ASSERT_EQ(run(shared, products[11], ctx), alone[11]) << "two threads after one";
}

TEST(Matmul, PackedWeightsGiveTheExactProductOfTheirValues) {
  // A weight packed once into oneDNN's blocked layout holds the same values: a product reading it
  // is the exact product of the bf16 values up to fp32 accumulation, as with the plain weight
  // (whose result can differ in the last bits: oneDNN may sum the inner dimension in another
  // order), for one row (decoding) and many, odd widths, a strided input and output, with a bias
  // and an epilogue activation. A packed weight that does not fit the product, or with float32
  // rows, is refused by name.
  ThreadContext ctx(2);
  struct Dims {
    int64_t rows, in, out;
  };
  for (const Dims d : {Dims{1, 5, 3}, Dims{1, 576, 1536}, Dims{3, 130, 77}, Dims{200, 64, 96},
                       Dims{1, 1536, 576}}) {
    SCOPED_TRACE(::testing::Message() << d.rows << " rows, W [" << d.out << ", " << d.in << "]");
    const int64_t ldx = d.in + 3, ldy = d.out + 2;
    auto x = random_vector(static_cast<size_t>(d.rows * ldx), 11);
    auto w = random_vector(static_cast<size_t>(d.out * d.in), 12);
    auto bias = random_vector(static_cast<size_t>(d.out), 13);
    std::vector<bf16> x16(x.size()), w16(w.size());
    to_bf16(x.data(), x16.data(), x.size());
    to_bf16(w.data(), w16.data(), w.size());
    const PackedWeight packed(w16.data(), d.in, d.out);
    PackedWeightStore store;
    const PackedWeight stored(w16.data(), d.in, d.out, &store);  // the same copy, in a store
    EXPECT_EQ(stored.bytes(), packed.bytes());
    EXPECT_EQ(packed.in_features(), d.in);
    EXPECT_EQ(packed.out_features(), d.out);
    EXPECT_GE(packed.bytes(), static_cast<size_t>(d.in * d.out) * sizeof(bf16));
    EXPECT_TRUE(packed.serves(1) && packed.serves(PackedWeight::kPackedRows));
    const LinearShape s{.rows = d.rows, .in_features = d.in, .out_features = d.out};
    for (const std::optional<Activation> act :
         {std::optional<Activation>{}, std::optional<Activation>{Activation::gelu_tanh}}) {
      std::vector<float> y(static_cast<size_t>(d.rows * ldy), 7.0f);
      linear_forward_bf16(ctx, s, x16.data(), ldx, packed, bias.data(), y.data(), ldy, act);
      for (int64_t i = 0; i < d.rows; ++i)
        for (int64_t j = 0; j < d.out; ++j) {
          double z = bias[static_cast<size_t>(j)], mag = std::fabs(z);
          for (int64_t p = 0; p < d.in; ++p) {
            const double t = double(to_float(x16[static_cast<size_t>(i * ldx + p)])) *
                             double(to_float(w16[static_cast<size_t>(j * d.in + p)]));
            z += t;
            mag += std::fabs(t);
          }
          // GELU's slope is below 1.13: the pre-activation's error bound carries over.
          const double want =
              act ? 0.5 * z * (1 + std::tanh(0.7978845608 * (z + 0.044715 * z * z * z))) : z;
          ASSERT_NEAR(y[static_cast<size_t>(i * ldy + j)], want, 1e-5 * (1 + 2 * mag))
              << i << "," << j;
        }
      for (int64_t i = 0; i < d.rows; ++i)  // the padding between rows is not written
        for (int64_t j = d.out; j < ldy; ++j) ASSERT_EQ(y[static_cast<size_t>(i * ldy + j)], 7.0f);
      std::vector<float> ys(y.size(), 7.0f);
      linear_forward_bf16(ctx, s, x16.data(), ldx, stored, bias.data(), ys.data(), ldy, act);
      ASSERT_EQ(ys, y) << "the copy in a store gives other bits";
    }
  }
  std::vector<bf16> w16(12, to_bf16(0.5f));
  const PackedWeight packed(w16.data(), 4, 3);  // W [3, 4]
  float y[3];
  std::vector<bf16> x16(5, to_bf16(1.0f));
  std::vector<float> x(5, 1.0f);
  auto refused = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("packed weight"), std::string::npos) << e.what();
    }
  };
  refused([&] {  // in_features 5 against a weight of 4
    linear_forward_bf16(ctx, {.rows = 1, .in_features = 5, .out_features = 3}, x16.data(), 5,
                        packed, nullptr, y, 3);
  });
  try {  // an empty weight
    const PackedWeight empty(w16.data(), 0, 3);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PackedWeight: empty weight [3, 0]"), std::string::npos)
        << e.what();
  }
  const PackedWeight none;
  EXPECT_TRUE(none.empty());
  EXPECT_FALSE(none.serves(1));
  refused([&] {  // an empty packed weight
    matmul(ctx, {.rows = 1, .cols = 4, .ld = 4, .bf16 = x16.data()},
           {.rows = 4, .cols = 3, .packed = &none}, {y, 3});
  });
  refused([&] {  // float32 rows
    matmul(ctx, {x.data(), 1, 4, 4}, {.rows = 4, .cols = 3, .packed = &packed}, {y, 3});
  });
}

TEST(Matmul, OneRowOfAnySizeMatchesNaiveLoops) {
  // One row (a matrix-vector product, as decoding a token runs) takes sgemm at any size, its bias
  // copied in first and the activation applied after: here 4.5 M multiply-adds, above the
  // primitive's threshold, with a bias, GELU and a strided output, and a transposed weight as
  // linear layers store it.
  ThreadContext ctx(2);
  const int64_t in = 1100, out = 4099, ldy = out + 3;
  auto x = random_vector(static_cast<size_t>(in), 21);
  auto w = random_vector(static_cast<size_t>(out * in), 22);
  auto bias = random_vector(static_cast<size_t>(out), 23);
  for (const std::optional<Activation> act :
       {std::optional<Activation>{}, std::optional<Activation>{Activation::gelu_tanh}}) {
    std::vector<float> y(static_cast<size_t>(ldy), 7.0f);
    linear_forward(ctx, {.rows = 1, .in_features = in, .out_features = out}, x.data(), in, w.data(),
                   bias.data(), y.data(), ldy, act);
    for (int64_t j = 0; j < out; ++j) {
      double z = bias[static_cast<size_t>(j)], mag = std::fabs(z);
      for (int64_t p = 0; p < in; ++p) {
        const double t = double(x[static_cast<size_t>(p)]) * w[static_cast<size_t>(j * in + p)];
        z += t;
        mag += std::fabs(t);
      }
      const double want =
          act ? 0.5 * z * (1 + std::tanh(0.7978845608 * (z + 0.044715 * z * z * z))) : z;
      ASSERT_NEAR(y[static_cast<size_t>(j)], want, 1e-5 * (1 + mag)) << j;
    }
    for (int64_t j = out; j < ldy; ++j) ASSERT_EQ(y[static_cast<size_t>(j)], 7.0f);
  }
}

TEST(Matmul, RejectsMismatchedInnerDimensions) {
  ThreadContext ctx(1);
  float x = 0;
  EXPECT_THROW(matmul(ctx, {&x, 2, 3, 3}, {&x, 4, 2, 2}, {&x, 2}), Error);
}

TEST(Linear, ForwardAndBackwardMatchNaiveLoops) {
  ThreadContext ctx(2);
  const LinearShape s{9, 6, 5};
  auto x = random_vector(9 * 6, 3), w = random_vector(5 * 6, 4), bias = random_vector(5, 5);
  auto dy = random_vector(9 * 5, 6);
  std::vector<float> y(9 * 5), dx(9 * 6), dw(5 * 6), db(5);
  linear_forward(ctx, s, x.data(), 6, w.data(), bias.data(), y.data(), 5);
  linear_backward(ctx, s, x.data(), 6, w.data(), dy.data(), 5,
                  {dx.data(), 6, dw.data(), db.data(), false});
  for (int r = 0; r < 9; ++r)
    for (int o = 0; o < 5; ++o) {
      double v = bias[o];
      for (int i = 0; i < 6; ++i) v += double(x[r * 6 + i]) * w[o * 6 + i];
      EXPECT_NEAR(y[r * 5 + o], v, 1e-5);
    }
  for (int r = 0; r < 9; ++r)
    for (int i = 0; i < 6; ++i) {
      double v = 0;
      for (int o = 0; o < 5; ++o) v += double(dy[r * 5 + o]) * w[o * 6 + i];
      EXPECT_NEAR(dx[r * 6 + i], v, 1e-5);
    }
  for (int o = 0; o < 5; ++o) {
    double vb = 0;
    for (int r = 0; r < 9; ++r) vb += dy[r * 5 + o];
    EXPECT_NEAR(db[o], vb, 1e-5);
    for (int i = 0; i < 6; ++i) {
      double v = 0;
      for (int r = 0; r < 9; ++r) v += double(dy[r * 5 + o]) * x[r * 6 + i];
      EXPECT_NEAR(dw[o * 6 + i], v, 1e-5);
    }
  }
}

}  // namespace
}  // namespace headlight::ops

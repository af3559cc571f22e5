#include "headlight/ops/matmul.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "headlight/core/error.h"
#include "headlight/ops/layers.h"

namespace headlight::ops {

namespace {
// Below this many multiply-adds dnnl_sgemm runs instead of the matmul primitive, and for one row
// of a at any size (a matrix-vector product: decoding a token). With a plain weight the primitive
// first copies it into its blocked layout; sgemm's matrix-vector kernel reads it once, where it
// lies (Zen 4, 2 threads, one row against W 8,192 × 2,048: 3.4 ms primitive, 2.1 ms sgemm, the
// weight's bytes at the machine's read bandwidth; against SmolLM2's 49,152 × 576 LM head 5.9 and
// 5.2 ms).
constexpr int64_t kPrimitiveMinWork = int64_t{1} << 22;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}
}  // namespace

// What a product against a packed weight is made for besides the weight: the rows of a, its
// leading dimension and orientation, the output's, the epilogue, and the threads it splits its
// work over (oneDNN plans a primitive for the thread count it is made under, as its own primitive
// cache keys it).
struct ProductKey {
  int64_t rows, lda, ldc, multiply_ld;
  int threads;
  bool in_parallel;
  bool a_transposed, out16, bias, multiply;
  float alpha, beta;
  int activation;  // −1: none
  bool operator==(const ProductKey&) const = default;
};

struct PackedWeight::Impl {
  int64_t in = 0, out = 0;
  dnnl::memory memory;  // Wᵀ [in, out] in the layout oneDNN chose (in a store, or its own buffer)
  bool any_rows = false;  // many rows get the same layout (serves)
  // The last kKeptProducts products made against this weight, newest last. Decoding makes the
  // same one or two every token: kept, a call skips oneDNN's primitive descriptor (its
  // implementation search) and its primitive-cache lookup. One row, 2 threads, Zen 4, the weight
  // in L2: W [64, 64] 3.5 → 1.45 µs a call, SmolLM2's [576, 576] 9.7 → 7.8, [1728, 576] 19.2 →
  // 16.3. SmolLM2 makes 121 a token; its 400-token bf16 generation (about 10 ms a token from
  // memory) moved within the run-to-run noise (medians of 8 alternating runs 4.08 → 4.05 s).
  static constexpr size_t kKeptProducts = 8;
  mutable std::mutex mutex;  // guards products (a weight may serve several threads at once)
  mutable std::vector<std::pair<ProductKey, dnnl::matmul>> products;
};

namespace {
// The weight layout oneDNN's bf16 product picks for `rows` rows against W [out, in].
dnnl::memory::desc weight_layout(int64_t rows, int64_t in, int64_t out) {
  using dnnl::memory;
  const auto bt = memory::data_type::bf16;
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(memory::desc({rows, in}, bt, memory::dims{in, 1}),
                         memory::desc({in, out}, bt, memory::format_tag::any),
                         memory::desc({rows, out}, memory::data_type::f32, memory::dims{out, 1})),
      cpu_engine());
  return pd.weights_desc();
}
}  // namespace

bool PackedWeight::serves(int64_t rows) const {
  return impl_ && (impl_->any_rows || rows <= kPackedRows);
}

PackedWeight::PackedWeight() = default;
PackedWeight::PackedWeight(PackedWeight&&) noexcept = default;
PackedWeight& PackedWeight::operator=(PackedWeight&&) noexcept = default;
PackedWeight::~PackedWeight() = default;

int64_t PackedWeight::in_features() const {
  return impl_ ? impl_->in : 0;
}
int64_t PackedWeight::out_features() const {
  return impl_ ? impl_->out : 0;
}
size_t PackedWeight::bytes() const {
  return impl_ ? impl_->memory.get_desc().get_size() : 0;
}

std::byte* PackedWeightStore::take(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  const auto capacity = [](const Tensor& t) { return static_cast<size_t>(t.numel()) * 2; };
  if (chunks_.empty() || used_ + bytes > capacity(chunks_.back())) {
    const size_t chunk = std::max(bytes, kChunkBytes);
    chunks_.emplace_back(DType::bf16, Shape{static_cast<int64_t>(chunk / 2)});
    used_ = 0;
  }
  std::byte* at = chunks_.back().data<std::byte>() + used_;
  used_ += bytes;
  return at;
}

void PackedWeightStore::clear() {
  chunks_.clear();
  used_ = 0;
}

size_t PackedWeightStore::reserved() const {
  size_t n = 0;
  for (const Tensor& t : chunks_) n += static_cast<size_t>(t.numel()) * 2;
  return n;
}

PackedWeight::PackedWeight(const bf16* weight, int64_t in_features, int64_t out_features,
                           PackedWeightStore* store) {
  check(in_features > 0 && out_features > 0, "PackedWeight: empty weight [{}, {}]", out_features,
        in_features);
  using dnnl::memory;
  const auto bt = memory::data_type::bf16;
  const memory::desc plain({in_features, out_features}, bt, memory::dims{1, in_features});
  try {
    // The layout oneDNN's product picks for one input row (decoding).
    const memory::desc layout = weight_layout(1, in_features, out_features);
    memory packed = store ? memory(layout, cpu_engine(), store->take(layout.get_size()))
                          : memory(layout, cpu_engine());
    impl_ = std::make_unique<Impl>();
    impl_->in = in_features;
    impl_->out = out_features;
    impl_->memory = std::move(packed);
    impl_->any_rows = weight_layout(512, in_features, out_features) == layout;
    memory src(plain, cpu_engine(), const_cast<bf16*>(weight));
    dnnl::stream stream(cpu_engine());
    dnnl::reorder(src, impl_->memory).execute(stream, src, impl_->memory);
    stream.wait();
  } catch (const dnnl::error& e) {
    fail("PackedWeight: oneDNN failed ({}) for a weight [{}, {}]", e.what(), out_features,
         in_features);
  }
}

void matmul(ThreadContext& ctx, const MatrixArg& a, const MatrixArg& b, const OutputArg& c) {
  check(a.cols == b.rows, "matmul: inner dimensions differ: a is [{}, {}], b is [{}, {}]", a.rows,
        a.cols, b.rows, b.cols);
  const bool bf16 = a.bf16 != nullptr;
  const PackedWeight::Impl* packed = b.packed && !b.packed->empty() ? &b.packed->impl() : nullptr;
  check(!b.packed ||
            (packed && bf16 && !b.data && !b.bf16 && packed->in == b.rows && packed->out == b.cols),
        "matmul: a packed weight [{}, {}] as b [{}, {}] needs bf16 rows of a and no other b",
        packed ? packed->out : 0, packed ? packed->in : 0, b.rows, b.cols);
  check(bf16 == (b.bf16 != nullptr || packed != nullptr) && (bf16 ? !a.data && !b.data : true),
        "matmul: both inputs must be float32 or both bf16");
  const int64_t m = a.rows, n = b.cols, k = a.cols;
  if (m == 0 || n == 0) return;
  const bool out16 = c.data16 != nullptr;
  check(!out16 || (c.beta == 0.0f && !c.data),
        "matmul: a bf16 output needs beta = 0 and no float32 c");
  check(!c.multiply || (c.beta == 0.0f && c.multiply_ld >= n),
        "matmul: a multiplying epilogue needs beta = 0 and multiply_ld ({}) of at least the "
        "columns ({})",
        c.multiply_ld, n);
  if (k == 0) {
    if (out16) {  // an empty product, beta = 0: zeros
      for (int64_t i = 0; i < m; ++i) std::fill_n(c.data16 + i * c.ld, n, headlight::bf16{});
      return;
    }
    // oneDNN rejects K = 0; the product is empty, so c = beta · c.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c.data[i * c.ld + j] = c.beta == 0.0f ? 0.0f : c.beta * c.data[i * c.ld + j];
    return;
  }
  check(c.bias == nullptr || c.beta == 0.0f, "matmul: a bias needs beta = 0");
  check(!c.activation || (c.beta == 0.0f && *c.activation != Activation::swiglu),
        "matmul: an epilogue activation needs beta = 0 and an element-wise kind");
  OmpThreadsGuard threads(ctx.num_threads());
  // (oneDNN 2.6 has no bf16 gemm function.)
  if ((m * n * k < kPrimitiveMinWork || m == 1) && !bf16 && !out16) {
    float beta = c.beta;
    if (c.bias) {
      for (int64_t i = 0; i < m; ++i)
        std::memcpy(c.data + i * c.ld, c.bias, sizeof(float) * static_cast<size_t>(n));
      beta = 1.0f;
    }
    // Small products: creating a primitive costs more than the product; one row (decoding one
    // token): sgemm reads the weight where it lies (kPrimitiveMinWork).
    const dnnl_status_t status =
        dnnl_sgemm(a.transposed ? 'T' : 'N', b.transposed ? 'T' : 'N', m, n, k, c.alpha, a.data,
                   a.ld, b.data, b.ld, beta, c.data, c.ld);
    check(status == dnnl_success, "matmul: oneDNN sgemm failed (status {}) for [{}, {}] x [{}, {}]",
          static_cast<int>(status), m, k, k, n);
    if (c.activation) {
      std::vector<float> row(static_cast<size_t>(n));  // the kernels take distinct in and out
      for (int64_t i = 0; i < m; ++i) {
        std::copy_n(c.data + i * c.ld, n, row.data());
        activation_forward(ctx, {.kind = *c.activation, .rows = 1, .width = n}, row.data(),
                           c.data + i * c.ld);
      }
    }
    if (c.multiply)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c.data[i * c.ld + j] *= c.multiply[i * c.multiply_ld + j];
    return;
  }
  // oneDNN's matmul primitive (brgemm kernels on AVX-512/AVX2, faster than dnnl_sgemm on the
  // model's shapes: docs/notes/2026-12-02-products.md). A transposed operand is the same memory
  // with swapped strides. The primitive itself comes from oneDNN's primitive cache after the
  // first call of a shape, or, against a packed weight, from the products the weight keeps.
  using dnnl::memory;
  const dnnl::engine& engine = cpu_engine();
  const auto in_type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc a_md({m, k}, in_type,
                          a.transposed ? memory::dims{1, a.ld} : memory::dims{a.ld, 1});
  const memory::desc b_md =
      packed ? packed->memory.get_desc()
             : memory::desc({k, n}, in_type,
                            b.transposed ? memory::dims{1, b.ld} : memory::dims{b.ld, 1});
  const memory::desc c_md({m, n}, out16 ? memory::data_type::bf16 : memory::data_type::f32,
                          memory::dims{c.ld, 1});
  const memory::desc multiply_md({m, n}, memory::data_type::f32, memory::dims{c.multiply_ld, 1});
  const memory::desc bias_md({1, n}, memory::data_type::f32, memory::dims{n, 1});
  auto make_product = [&] {
    dnnl::primitive_attr attr;
    if (c.alpha != 1.0f) attr.set_output_scales(0, {c.alpha});
    if (c.beta != 0.0f || c.activation || c.multiply) {
      dnnl::post_ops ops;
      if (c.beta != 0.0f) ops.append_sum(c.beta);
      if (c.activation)
        ops.append_eltwise(1.0f,
                           *c.activation == Activation::gelu_erf ? dnnl::algorithm::eltwise_gelu_erf
                           : *c.activation == Activation::gelu_tanh
                               ? dnnl::algorithm::eltwise_gelu_tanh
                               : dnnl::algorithm::eltwise_relu,
                           0.0f, 0.0f);
      if (c.multiply) ops.append_binary(dnnl::algorithm::binary_mul, multiply_md);
      attr.set_post_ops(ops);
    }
    return dnnl::matmul(
        dnnl::matmul::primitive_desc(c.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                            : dnnl::matmul::desc(a_md, b_md, c_md),
                                     attr, engine));
  };
  try {
    dnnl::matmul product;
    if (packed) {  // the weight's kept products first (PackedWeight::Impl::products)
      const ProductKey key{.rows = m,
                           .lda = a.ld,
                           .ldc = c.ld,
                           .multiply_ld = c.multiply ? c.multiply_ld : 0,
                           .threads = omp_get_max_threads(),
                           .in_parallel = omp_in_parallel() != 0,
                           .a_transposed = a.transposed,
                           .out16 = out16,
                           .bias = c.bias != nullptr,
                           .multiply = c.multiply != nullptr,
                           .alpha = c.alpha,
                           .beta = c.beta,
                           .activation = c.activation ? static_cast<int>(*c.activation) : -1};
      const std::lock_guard<std::mutex> lock(packed->mutex);
      auto& kept = packed->products;
      const auto found = std::find_if(kept.begin(), kept.end(),
                                      [&](const auto& entry) { return entry.first == key; });
      if (found != kept.end()) {
        product = found->second;
      } else {
        product = make_product();
        if (kept.size() == PackedWeight::Impl::kKeptProducts) kept.erase(kept.begin());
        kept.emplace_back(key, product);
      }
    } else {
      product = make_product();
    }
    dnnl::stream stream(engine);
    memory am(a_md, engine,
              bf16 ? static_cast<void*>(const_cast<headlight::bf16*>(a.bf16))
                   : static_cast<void*>(const_cast<float*>(a.data))),
        bm = packed ? packed->memory
                    : memory(b_md, engine,
                             bf16 ? static_cast<void*>(const_cast<headlight::bf16*>(b.bf16))
                                  : static_cast<void*>(const_cast<float*>(b.data)));
    memory cm(c_md, engine, out16 ? static_cast<void*>(c.data16) : static_cast<void*>(c.data));
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (c.bias) args.emplace(DNNL_ARG_BIAS, memory(bias_md, engine, const_cast<float*>(c.bias)));
    if (c.multiply)  // the binary post-op is the last: index 0, 1 or 2 after sum and eltwise
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP((c.beta != 0.0f) + (c.activation ? 1 : 0)) |
                       DNNL_ARG_SRC_1,
                   memory(multiply_md, engine, const_cast<float*>(c.multiply)));
    product.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    fail("matmul: oneDNN failed ({}) for [{}, {}] x [{}, {}]", e.what(), m, k, k, n);
  }
}

void linear_forward(ThreadContext& ctx, const LinearShape& s, const float* x, int64_t ldx,
                    const float* weight, const float* bias, float* y, int64_t ldy,
                    std::optional<Activation> activation) {
  if (s.rows == 0 || s.out_features == 0) return;
  matmul(
      ctx, {x, s.rows, s.in_features, ldx, false},
      {weight, s.in_features, s.out_features, s.in_features, true},
      {.data = y, .ld = ldy, .alpha = 1.0f, .beta = 0.0f, .bias = bias, .activation = activation});
}

void linear_forward_bf16(ThreadContext& ctx, const LinearShape& s, const bf16* x, int64_t ldx,
                         const bf16* weight, const float* bias, float* y, int64_t ldy,
                         std::optional<Activation> activation) {
  if (s.rows == 0 || s.out_features == 0) return;
  matmul(
      ctx, {.rows = s.rows, .cols = s.in_features, .ld = ldx, .bf16 = x},
      {.rows = s.in_features,
       .cols = s.out_features,
       .ld = s.in_features,
       .transposed = true,
       .bf16 = weight},
      {.data = y, .ld = ldy, .alpha = 1.0f, .beta = 0.0f, .bias = bias, .activation = activation});
}

void linear_forward_bf16(ThreadContext& ctx, const LinearShape& s, const bf16* x, int64_t ldx,
                         const PackedWeight& weight, const float* bias, float* y, int64_t ldy,
                         std::optional<Activation> activation) {
  if (s.rows == 0 || s.out_features == 0) return;
  matmul(
      ctx, {.rows = s.rows, .cols = s.in_features, .ld = ldx, .bf16 = x},
      {.rows = s.in_features, .cols = s.out_features, .packed = &weight},
      {.data = y, .ld = ldy, .alpha = 1.0f, .beta = 0.0f, .bias = bias, .activation = activation});
}

void linear_forward_bf16_rounded(ThreadContext& ctx, const LinearShape& s, const bf16* x,
                                 int64_t ldx, const bf16* weight, const float* bias, bf16* y16,
                                 int64_t ldy) {
  if (s.rows == 0 || s.out_features == 0) return;
  matmul(ctx, {.rows = s.rows, .cols = s.in_features, .ld = ldx, .bf16 = x},
         {.rows = s.in_features,
          .cols = s.out_features,
          .ld = s.in_features,
          .transposed = true,
          .bf16 = weight},
         {.ld = ldy, .alpha = 1.0f, .beta = 0.0f, .bias = bias, .data16 = y16});
}

void linear_forward_bf16_rounded(ThreadContext& ctx, const LinearShape& s, const bf16* x,
                                 int64_t ldx, const PackedWeight& weight, const float* bias,
                                 bf16* y16, int64_t ldy) {
  if (s.rows == 0 || s.out_features == 0) return;
  matmul(ctx, {.rows = s.rows, .cols = s.in_features, .ld = ldx, .bf16 = x},
         {.rows = s.in_features, .cols = s.out_features, .packed = &weight},
         {.ld = ldy, .alpha = 1.0f, .beta = 0.0f, .bias = bias, .data16 = y16});
}

void linear_backward(ThreadContext& ctx, const LinearShape& s, const float* x, int64_t ldx,
                     const float* weight, const float* dy, int64_t ldy, const LinearGrads& g) {
  const float beta = g.accumulate ? 1.0f : 0.0f;
  if (g.dx) {
    matmul(ctx, {dy, s.rows, s.out_features, ldy, false},
           {weight, s.out_features, s.in_features, s.in_features, false}, {g.dx, g.lddx, 1, beta});
  }
  if (g.dweight) {
    matmul(ctx, {dy, s.out_features, s.rows, ldy, true}, {x, s.rows, s.in_features, ldx, false},
           {g.dweight, s.in_features, 1, beta});
  }
  if (g.dbias) {
    // Column sums in row order, a block of columns per worker: the same bits for any thread count.
    constexpr int64_t kCols = 64;
    ctx.parallel_for((s.out_features + kCols - 1) / kCols, [&](Range blocks, int) {
      double sum[kCols];
      for (int64_t blk = blocks.begin; blk < blocks.end; ++blk) {
        const int64_t o0 = blk * kCols, width = std::min(kCols, s.out_features - o0);
        for (int64_t j = 0; j < width; ++j) sum[j] = 0.0;
        add_column_sums(dy + o0, ldy, s.rows, width, sum);
        for (int64_t j = 0; j < width; ++j)
          g.dbias[o0 + j] = (g.accumulate ? g.dbias[o0 + j] : 0.0f) + static_cast<float>(sum[j]);
      }
    });
  }
}

}  // namespace headlight::ops

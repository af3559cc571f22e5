// MultiheadAttention: construction, parameters and the forward pass (see the header for the math).

#include "headlight/attention/multihead_attention.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "headlight/core/rng.h"
#include "headlight/ops/matmul.h"
#include "src/attention/multihead_attention_cache.h"

namespace headlight::attention {
namespace {

void fill_uniform(Tensor& t, Generator& g, float bound) {
  g.fill_uniform(t.data(), t.numel(), -bound, bound);
}

// A view of `t` as a contiguous f32 tensor (copied when strided); throws naming `what` otherwise.
Tensor contiguous_f32(const TensorView& t, const char* what) {
  check(t.dtype() == DType::f32, "{}: dtype must be float32, got {}", what, dtype_name(t.dtype()));
  return contiguous_copy(t);
}

// The weights forward returns from the probabilities [N, H, L, S']: averaged over the heads when
// `average` ([N, L, S']), and without the batch dim when the input was unbatched.
Tensor weights_of(Tensor probs, bool average, bool batched) {
  const int64_t N = probs.size(0), H = probs.size(1), L = probs.size(2), Sx = probs.size(3);
  if (!average) return batched ? std::move(probs) : std::move(probs).reshaped({H, L, Sx});
  Tensor avg = Tensor::zeros({N, L, Sx});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L * Sx; ++i)
        avg.data()[n * L * Sx + i] +=
            probs.data()[(n * H + h) * L * Sx + i] / static_cast<float>(H);
  return batched ? std::move(avg) : std::move(avg).reshaped({L, Sx});
}

}  // namespace

MultiheadAttention::MultiheadAttention(const MultiheadAttentionConfig& config, uint64_t seed)
    : config_(config) {
  MultiheadAttentionConfig& c = config_;
  if (c.kdim == 0) c.kdim = c.embed_dim;
  if (c.vdim == 0) c.vdim = c.embed_dim;
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  check(c.embed_dim > 0, "embed_dim: must be positive, got {}", c.embed_dim);
  check(c.num_heads > 0, "num_heads: must be positive, got {}", c.num_heads);
  check(c.embed_dim % c.num_heads == 0, "embed_dim ({}) must be divisible by num_heads ({})",
        c.embed_dim, c.num_heads);
  check(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
        "num_kv_heads ({}) must be positive and divide num_heads ({})", c.num_kv_heads,
        c.num_heads);
  check(c.kdim > 0 && c.vdim > 0, "kdim ({}) and vdim ({}) must be positive", c.kdim, c.vdim);
  check(std::isfinite(c.dropout) && c.dropout >= 0.0f && c.dropout < 1.0f,
        "dropout: must be in [0, 1), got {}", c.dropout);
  checked_numel({c.embed_dim, c.embed_dim}, "embed_dim");

  const int64_t E = c.embed_dim, Ekv = c.num_kv_heads * head_dim();
  Generator g(seed);
  auto add = [&](const std::string& name, Shape shape) -> Tensor& {
    names_.push_back(name);
    grads_.emplace(name, Tensor::zeros(shape));
    return params_.emplace(name, Tensor::zeros(std::move(shape))).first->second;
  };
  if (packed_in_proj()) {
    Tensor& w = add("in_proj_weight", {E + 2 * Ekv, E});
    fill_uniform(w, g, std::sqrt(6.0f / static_cast<float>(E + 2 * Ekv + E)));
  } else {
    fill_uniform(add("q_proj_weight", {E, E}), g, std::sqrt(6.0f / static_cast<float>(2 * E)));
    fill_uniform(add("k_proj_weight", {Ekv, c.kdim}), g,
                 std::sqrt(6.0f / static_cast<float>(Ekv + c.kdim)));
    fill_uniform(add("v_proj_weight", {Ekv, c.vdim}), g,
                 std::sqrt(6.0f / static_cast<float>(Ekv + c.vdim)));
  }
  if (c.bias) add("in_proj_bias", {E + 2 * Ekv});
  if (c.add_bias_kv) {
    for (const char* name : {"bias_k", "bias_v"}) {
      Tensor& b = add(name, {1, 1, Ekv});
      const float stddev = std::sqrt(2.0f / static_cast<float>(2 * Ekv));
      for (int64_t i = 0; i < b.numel(); ++i) b.data()[i] = g.normal(0.0f, stddev);
    }
  }
  fill_uniform(add("out_proj.weight", {E, E}), g, 1.0f / std::sqrt(static_cast<float>(E)));
  if (c.bias) add("out_proj.bias", {E});
  gates_ = HeadGates(1, c.num_heads);
}

MultiheadAttention::~MultiheadAttention() = default;
MultiheadAttention::MultiheadAttention(MultiheadAttention&&) noexcept = default;
MultiheadAttention& MultiheadAttention::operator=(MultiheadAttention&&) noexcept = default;

bool MultiheadAttention::packed_in_proj() const {
  return config_.kdim == config_.embed_dim && config_.vdim == config_.embed_dim;
}

Tensor& MultiheadAttention::parameter(const std::string& name) {
  auto it = params_.find(name);
  check(it != params_.end(), "MultiheadAttention: no parameter named '{}'", name);
  return it->second;
}

const Tensor& MultiheadAttention::parameter(const std::string& name) const {
  return const_cast<MultiheadAttention*>(this)->parameter(name);
}

const Tensor& MultiheadAttention::grad(const std::string& name) const {
  auto it = grads_.find(name);
  check(it != grads_.end(), "MultiheadAttention: no parameter named '{}'", name);
  return it->second;
}

std::map<std::string, Tensor> MultiheadAttention::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : params_) out.emplace(name, contiguous_copy(t.view()));
  return out;
}

void MultiheadAttention::load_state_dict(const std::map<std::string, TensorView>& state) {
  for (const auto& [name, view] : state) {
    check(params_.count(name) == 1, "load_state_dict: unexpected key '{}' (this module has {})",
          name, fmt::join(names_, ", "));
  }
  // Check everything before writing anything, so a bad dict leaves the module unchanged.
  for (const std::string& name : names_) {
    auto it = state.find(name);
    check(it != state.end(), "load_state_dict: missing key '{}'", name);
    const Tensor& p = params_.at(name);
    check(it->second.dtype() == DType::f32, "load_state_dict: '{}' must be float32, got {}", name,
          dtype_name(it->second.dtype()));
    check(it->second.shape() == p.shape(), "load_state_dict: '{}' has shape {}, expected {}", name,
          shape_string(it->second.shape()), shape_string(p.shape()));
  }
  for (const std::string& name : names_) {
    Tensor copy = contiguous_copy(state.at(name));
    params_.at(name) = std::move(copy);
  }
}

// Checks the inputs' shapes against the config and each other (naming the argument and every
// shape) and sets the cache's row layouts; returns whether the input is batched.
bool MultiheadAttention::check_inputs(const TensorView& query, const TensorView& key,
                                      const TensorView& value, Cache& k) const {
  const MultiheadAttentionConfig& c = config_;
  const std::string shapes = fmt::format("query {}, key {}, value {}", shape_string(query.shape()),
                                         shape_string(key.shape()), shape_string(value.shape()));
  check(query.dim() == 2 || query.dim() == 3,
        "query: expected 3 dims ({}) or 2 dims unbatched (L, E), got {}",
        c.batch_first ? "N, L, E" : "L, N, E", shape_string(query.shape()));
  const bool batched = query.dim() == 3;
  check(key.dim() == query.dim() && value.dim() == query.dim(),
        "key/value: must have as many dims as query ({})", shapes);
  const bool bf = batched && c.batch_first;
  const int64_t length_dim = batched && !bf ? 0 : (bf ? 1 : 0);
  const int64_t N = batched ? query.size(bf ? 0 : 1) : 1;
  const int64_t L = query.size(length_dim), S = key.size(length_dim);
  check(query.size(-1) == c.embed_dim, "query: last dim {} must equal embed_dim {} ({})",
        query.size(-1), c.embed_dim, shapes);
  check(key.size(-1) == c.kdim, "key: last dim {} must equal kdim {} ({})", key.size(-1), c.kdim,
        shapes);
  check(value.size(-1) == c.vdim, "value: last dim {} must equal vdim {} ({})", value.size(-1),
        c.vdim, shapes);
  if (batched) {
    const int64_t bdim = bf ? 0 : 1;
    check(key.size(bdim) == N && value.size(bdim) == N,
          "key/value: batch size must equal query's batch size {} ({})", N, shapes);
  }
  check(value.size(length_dim) == S, "value: length must equal key's length {} ({})", S, shapes);
  k.query_shape = query.shape();
  k.key_shape = key.shape();
  k.value_shape = value.shape();
  k.q_rows = RowLayout{.batch = N, .length = L, .batch_first = bf};
  k.k_rows = RowLayout{.batch = N, .length = S, .batch_first = bf};
  k.kv_len = S + (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
  return batched;
}

// q = x_q·W_qᵀ + b_q [rows_q, E]; keys and values projected and laid out per head with the extra
// bias and zero rows: k_full, v_full [N, H_kv, S', d].
void MultiheadAttention::project(ThreadContext& ctx, Cache& k) const {
  const MultiheadAttentionConfig& c = config_;
  const int64_t E = c.embed_dim, Hkv = c.num_kv_heads, d = head_dim(), Ekv = Hkv * d;
  const int64_t N = k.q_rows.batch, S = k.k_rows.length, Sx = k.kv_len;
  const int64_t rows_q = N * k.q_rows.length, rows_k = N * S;
  const bool packed = packed_in_proj();
  const float* w_q =
      packed ? params_.at("in_proj_weight").data() : params_.at("q_proj_weight").data();
  const float* w_k = packed ? w_q + E * E : params_.at("k_proj_weight").data();
  const float* w_v = packed ? w_q + (E + Ekv) * E : params_.at("v_proj_weight").data();
  const float* b_q = c.bias ? params_.at("in_proj_bias").data() : nullptr;
  const float* b_k = c.bias ? b_q + E : nullptr;
  const float* b_v = c.bias ? b_q + E + Ekv : nullptr;
  k.q = Tensor::empty({rows_q, E});
  Tensor kp = Tensor::empty({rows_k, Ekv}), vp = Tensor::empty({rows_k, Ekv});
  ops::linear_forward(ctx, {.rows = rows_q, .in_features = E, .out_features = E}, k.x_q.data(), E,
                      w_q, b_q, k.q.data(), E);
  ops::linear_forward(ctx, {.rows = rows_k, .in_features = c.kdim, .out_features = Ekv},
                      k.x_k.data(), c.kdim, w_k, b_k, kp.data(), Ekv);
  ops::linear_forward(ctx, {.rows = rows_k, .in_features = c.vdim, .out_features = Ekv},
                      k.x_v.data(), c.vdim, w_v, b_v, vp.data(), Ekv);
  k.k_full = Tensor::zeros({N, Hkv, Sx, d});
  k.v_full = Tensor::zeros({N, Hkv, Sx, d});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < Hkv; ++g) {
      float* kd = k.k_full.data() + (n * Hkv + g) * Sx * d;
      float* vd = k.v_full.data() + (n * Hkv + g) * Sx * d;
      for (int64_t s = 0; s < S; ++s) {
        std::memcpy(kd + s * d, kp.data() + k.k_rows.row(n, s) * Ekv + g * d, d * sizeof(float));
        std::memcpy(vd + s * d, vp.data() + k.k_rows.row(n, s) * Ekv + g * d, d * sizeof(float));
      }
      if (c.add_bias_kv) {
        std::memcpy(kd + S * d, params_.at("bias_k").data() + g * d, d * sizeof(float));
        std::memcpy(vd + S * d, params_.at("bias_v").data() + g * d, d * sizeof(float));
      }
    }
}

// attn_mask and key_padding_mask, checked and merged into one additive float mask
// k.mask [Nm, Hm, Lm, S'] (dims of 1 broadcast) that the attention options point at.
void MultiheadAttention::merge_masks(const MhaForwardOptions& opt, bool batched, Cache& k) const {
  const int64_t H = config_.num_heads, N = k.q_rows.batch, L = k.q_rows.length;
  const int64_t S = k.k_rows.length, Sx = k.kv_len;
  const float ninf = -std::numeric_limits<float>::infinity();
  const TensorView& am = opt.attn_mask;
  const TensorView& kpm = opt.key_padding_mask;
  const bool has_am = !am.empty_view(), has_kpm = !kpm.empty_view();
  bool am_per_head = false;
  if (has_am) {
    check(am.dtype() == DType::boolean || am.dtype() == DType::f32,
          "attn_mask: dtype must be bool or float, got {}", dtype_name(am.dtype()));
    if (am.dim() == 2) {
      check(am.size(0) == L && am.size(1) == S, "attn_mask: 2-D shape {} must be (L, S) = ({}, {})",
            shape_string(am.shape()), L, S);
    } else {
      const int64_t want0 = batched ? N * H : H;
      check(am.dim() == 3 && am.size(0) == want0 && am.size(1) == L && am.size(2) == S,
            "attn_mask: shape {} must be (L, S) = ({}, {}) or ({}, L, S) = ({}, {}, {})",
            shape_string(am.shape()), L, S, batched ? "N*num_heads" : "num_heads", want0, L, S);
      am_per_head = true;
    }
  }
  if (has_kpm) {
    check(kpm.dtype() == DType::boolean || kpm.dtype() == DType::f32,
          "key_padding_mask: dtype must be bool or float, got {}", dtype_name(kpm.dtype()));
    const Shape want = batched ? Shape{N, S} : Shape{S};
    check(kpm.shape() == want, "key_padding_mask: shape {} must be {}", shape_string(kpm.shape()),
          shape_string(want));
  }
  AttentionOptions& o = k.params.options;
  o.causal = opt.is_causal && !has_am;
  if (!has_am && !has_kpm) return;
  const int64_t Nm = (has_kpm || am_per_head) ? N : 1, Hm = am_per_head ? H : 1;
  const int64_t Lm = has_am ? L : 1;
  k.mask = Tensor::zeros({Nm, Hm, Lm, Sx});
  auto value_at = [&](const TensorView& m, const Shape& idx) -> float {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * m.strides()[i];
    if (m.dtype() == DType::boolean) return m.data_as<uint8_t>()[off] ? ninf : 0.0f;
    return m.data_as<float>()[off];
  };
  for (int64_t n = 0; n < Nm; ++n)
    for (int64_t h = 0; h < Hm; ++h)
      for (int64_t l = 0; l < Lm; ++l) {
        float* row = k.mask.data() + ((n * Hm + h) * Lm + l) * Sx;
        for (int64_t s = 0; s < S; ++s) {
          float m = 0;
          if (has_am) m += am_per_head ? value_at(am, {n * H + h, l, s}) : value_at(am, {l, s});
          if (has_kpm) m += batched ? value_at(kpm, {n, s}) : value_at(kpm, {s});
          row[s] = m;
        }
      }
  o.mask = MaskOperand{.kind = MaskKind::additive,
                       .data = k.mask.data(),
                       .batch_stride = Nm > 1 ? Hm * Lm * Sx : 0,
                       .head_stride = Hm > 1 ? Lm * Sx : 0,
                       .row_stride = Lm > 1 ? Sx : 0};
}

MhaOutput MultiheadAttention::forward(ThreadContext& ctx, const TensorView& query,
                                      const TensorView& key, const TensorView& value,
                                      const MhaForwardOptions& opt) {
  const MultiheadAttentionConfig& c = config_;
  const int64_t E = c.embed_dim, H = c.num_heads, Hkv = c.num_kv_heads, d = head_dim();
  auto cache = std::make_unique<Cache>();
  Cache& k = *cache;
  const bool batched = check_inputs(query, key, value, k);
  const int64_t N = k.q_rows.batch, L = k.q_rows.length, Sx = k.kv_len, rows_q = N * L;
  k.x_q = contiguous_f32(query, "query");
  k.x_k = contiguous_f32(key, "key");
  k.x_v = contiguous_f32(value, "value");
  project(ctx, k);
  merge_masks(opt, batched, k);
  AttentionOptions& o = k.params.options;
  o.alignment = Alignment::top_left;
  if (training_ && c.dropout > 0.0f) {
    o.dropout_p = c.dropout;
    o.dropout_seed = dropout_seed_++;
  }

  // ---- Attention over strided views of the projections.
  AttentionParams& p = k.params;
  p.shape = AttentionShape{.batch = N,
                           .heads = H,
                           .kv_heads = Hkv,
                           .len_q = L,
                           .len_kv = Sx,
                           .head_dim = d,
                           .value_dim = d};
  const RowLayout& qr = k.q_rows;
  p.q = Operand{.data = k.q.data(),
                .batch_stride = qr.batch_stride(E),
                .head_stride = d,
                .row_stride = qr.row_stride(E)};
  p.k = Operand{.data = k.k_full.data(),
                .batch_stride = Hkv * Sx * d,
                .head_stride = Sx * d,
                .row_stride = d};
  p.v = Operand{.data = k.v_full.data(),
                .batch_stride = Hkv * Sx * d,
                .head_stride = Sx * d,
                .row_stride = d};
  k.heads = Tensor::empty({rows_q, E});
  p.out = Operand{.data = k.heads.data(),
                  .batch_stride = qr.batch_stride(E),
                  .head_stride = d,
                  .row_stride = qr.row_stride(E)};
  Tensor probs;
  if (opt.need_weights) probs = Tensor::empty({N, H, L, Sx});
  p.probs = opt.need_weights ? probs.data() : nullptr;
  k.lse = Tensor::empty({N, H, L});
  p.lse = k.lse.data();  // kept, so that backward need not run the forward again
  attention::forward(ctx, p, c.kernel);
  p.probs = nullptr;

  // ---- Gates and the output projection.
  k.gated = Tensor::empty({rows_q, E});
  gates_.forward(ctx, 0, {.rows = rows_q, .heads = H, .head_dim = d}, k.heads.data(),
                 k.gated.data());
  MhaOutput out;
  out.output = Tensor::empty(query.shape());
  ops::linear_forward(ctx, {.rows = rows_q, .in_features = E, .out_features = E}, k.gated.data(), E,
                      params_.at("out_proj.weight").data(),
                      c.bias ? params_.at("out_proj.bias").data() : nullptr, out.output.data(), E);
  k.output_shape = out.output.shape();
  if (opt.need_weights)
    out.weights = weights_of(std::move(probs), opt.average_attn_weights, batched);
  cache_ = std::move(cache);
  return out;
}

}  // namespace headlight::attention

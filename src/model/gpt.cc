// GPT: construction (initialisation or weights from a TensorSource) and gradient bookkeeping.
// The forward and KV-cached decoding are in gpt_forward.cc, the backward in gpt_backward.cc.

#include <algorithm>
#include <cmath>
#include <set>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"
#include "headlight/model/gpt.h"
#include "src/model/gpt_state.h"

namespace headlight::model {

namespace {

GPTConfig config_of(const TensorSource& source) {
  const auto text = source.metadata("headlight.config");
  check(text.has_value(), "checkpoint metadata: missing \"headlight.config\" (the model config)");
  return config_from_json(*text);
}

}  // namespace

GPT::GPT(const GPTConfig& config, uint64_t seed)
    : config_(config),
      layout_(config),
      params_(Tensor::zeros({layout_.total()})),
      gates_(config.n_layer, config.n_head),
      state_(std::make_unique<State>()) {
  Generator gen(seed);
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config.n_layer));
  for (const ParameterEntry& e : layout_.entries()) {
    float* p = params_.data() + e.offset;
    const bool is_norm = e.name.find("ln_") != std::string::npos;
    const bool is_bias = e.name.ends_with(".bias");
    if (is_norm && !is_bias) {
      std::fill(p, p + e.numel, 1.0f);
    } else if (!is_bias) {
      const float stddev = e.name.ends_with("c_proj.weight") ? proj_std : 0.02f;
      for (int64_t i = 0; i < e.numel; ++i) p[i] = gen.normal(0.0f, stddev);
    }
  }
}

GPT::GPT(const TensorSource& source) : GPT(config_of(source), source) {}

GPT::GPT(const GPTConfig& config, const TensorSource& source)
    : config_(config),
      layout_(config_),
      params_(Tensor::zeros({layout_.total()})),
      gates_(config_.n_layer, config_.n_head),
      state_(std::make_unique<State>()) {
  std::set<std::string> expected;
  for (const ParameterEntry& e : layout_.entries()) {
    expected.insert(e.name);
    check(source.contains(e.name), "checkpoint: missing tensor \"{}\" (shape {}) for this config",
          e.name, shape_string(e.shape));
    const Shape got = source.shape(e.name);
    check(got == e.shape, "checkpoint: tensor \"{}\" has shape {}, the config needs {}", e.name,
          shape_string(got), shape_string(e.shape));
    source.read_f32(e.name, params_.data() + e.offset);
  }
  for (const std::string& name : source.names())
    check(expected.count(name) == 1, "checkpoint: unexpected tensor \"{}\" for this config{}", name,
          name == "lm_head.weight" ? " (tied_embeddings is true or there is no LM head)" : "");
}

GPT::GPT(GPT&&) noexcept = default;
GPT& GPT::operator=(GPT&&) noexcept = default;
GPT::~GPT() = default;

Tensor& GPT::grads_arena() const {
  if (grads_.numel() != layout_.total()) grads_ = Tensor::zeros({layout_.total()});
  return grads_;
}

void GPT::zero_grads() {
  if (grads_.numel() == layout_.total()) grads_.fill(0.0f);  // (else made zeroed when needed)
  gates_.zero_grads();
}

void GPT::check_tokens(const int32_t* tokens, int64_t batch, int64_t seq, int64_t offset,
                       bool one_sequence) const {
  check(batch > 0 && seq > 0, "tokens: expected a non-empty [batch, seq] array, got [{}, {}]",
        batch, seq);
  check(!one_sequence || offset + seq <= config_.block_size,
        "tokens: sequence of {} (after {} cached) is longer than block_size {}", seq, offset,
        config_.block_size);
  for (int64_t i = 0; i < batch * seq; ++i)
    check(tokens[i] >= 0 && tokens[i] < config_.vocab_size,
          "tokens: id {} at index {} is outside the vocabulary [0, {})", tokens[i], i,
          config_.vocab_size);
}

}  // namespace headlight::model

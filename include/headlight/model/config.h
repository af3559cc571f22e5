// GPTConfig: the shape and options of a GPT-style model, and its JSON form (the checkpoint's
// `headlight.config` metadata, docs/design.md §2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headlight/ops/layers.h"

namespace headlight::model {

enum class Positional : uint8_t { learned, sinusoidal, rope, alibi, none };
enum class Norm : uint8_t { layernorm, rmsnorm };

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;  // divides n_head (grouped-query attention when smaller)
  int64_t n_embd = 128;
  int64_t block_size = 128;  // longest sequence
  Positional positional = Positional::learned;
  Norm norm = Norm::layernorm;
  bool norm_first = true;  // pre-norm (GPT-2); false: post-norm (Vaswani et al.)
  bool bias = true;        // biases of the linear layers and LayerNorm
  bool causal = true;      // decoder; false: bidirectional encoder (masked-token loss)
  bool tied_embeddings = true;
  float dropout = 0.0f;
  int64_t mlp_ratio = 4;
  float rope_base = 10000.0f;
  // The blocks real models differ in (docs/design.md §2; defaults are headlight's own GPT).
  float norm_eps = 1e-5f;
  ops::Activation activation = ops::Activation::gelu_tanh;
  int64_t mlp_hidden = 0;       // the MLP's hidden width; 0: mlp_ratio · n_embd
  int64_t type_vocab_size = 0;  // > 0: token-type (segment) embeddings, BERT's
  bool embedding_norm = false;  // a norm of the summed embeddings (BERT's), ln_e
  bool lm_head = true;          // false: forward returns the final hidden states (an encoder)
  // Heads left in each layer after pruning (empty: n_head and n_kv_head in every layer). A layer
  // may keep 0 heads (its attention branch is then c_proj's bias alone). head_dim stays
  // n_embd / n_head.
  std::vector<int64_t> layer_heads{};
  std::vector<int64_t> layer_kv_heads{};
  // Query heads of each key/value head, per layer, when a pruned grouped-query layer's groups are
  // no longer equal (empty: heads(l) / kv_heads(l) each). Query heads stay ordered by group: the
  // first layer_groups[l][0] use key/value head 0, the next layer_groups[l][1] head 1, …
  std::vector<std::vector<int64_t>> layer_groups{};

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t heads(int64_t layer) const {
    return layer_heads.empty() ? n_head : layer_heads[static_cast<size_t>(layer)];
  }
  int64_t kv_heads(int64_t layer) const {
    return layer_kv_heads.empty() ? n_kv_head : layer_kv_heads[static_cast<size_t>(layer)];
  }
  // The query heads of each key/value head of a layer (kv_heads(layer) entries adding up to
  // heads(layer)).
  std::vector<int64_t> group_sizes(int64_t layer) const;
  // Whether a layer's groups are equal (one attention call covers the layer).
  bool uniform_groups(int64_t layer) const;
  int64_t qkv_width(int64_t layer) const {
    return (heads(layer) + 2 * kv_heads(layer)) * head_dim();
  }
  int64_t total_heads() const {
    int64_t n = 0;
    for (int64_t l = 0; l < n_layer; ++l) n += heads(l);
    return n;
  }
  int64_t mlp_width() const { return mlp_hidden > 0 ? mlp_hidden : mlp_ratio * n_embd; }
  // Width of c_fc's output: the hidden width, twice it for SwiGLU ([gate | up]).
  int64_t fc_width() const {
    return activation == ops::Activation::swiglu ? 2 * mlp_width() : mlp_width();
  }
  // What forward() returns per position: vocab_size logits, or n_embd hidden states.
  int64_t output_width() const { return lm_head ? vocab_size : n_embd; }
};

// Throws headlight::Error naming the field when the config is inconsistent (n_embd not divisible
// by n_head, n_kv_head not dividing n_head, odd head_dim with rope, non-positive sizes, dropout
// outside [0, 1)).
void validate(const GPTConfig& c);

std::string to_json(const GPTConfig& c);
// Parses and validates; unknown keys are ignored, missing keys keep their defaults except the
// sizes (vocab_size, n_layer, n_head, n_embd, block_size), which are required.
GPTConfig config_from_json(const std::string& json);

const char* positional_name(Positional p);
const char* norm_name(Norm n);
Positional parse_positional(const std::string& name);
Norm parse_norm(const std::string& name);

}  // namespace headlight::model

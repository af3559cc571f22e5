// GPTConfig validation and its JSON form.

#include "headlight/model/config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"

namespace headlight::model {

const char* positional_name(Positional p) {
  switch (p) {
    case Positional::learned:
      return "learned";
    case Positional::sinusoidal:
      return "sinusoidal";
    case Positional::rope:
      return "rope";
    case Positional::alibi:
      return "alibi";
    case Positional::none:
      return "none";
  }
  return "?";
}

const char* norm_name(Norm n) {
  return n == Norm::layernorm ? "layernorm" : "rmsnorm";
}

Positional parse_positional(const std::string& name) {
  for (Positional p : {Positional::learned, Positional::sinusoidal, Positional::rope,
                       Positional::alibi, Positional::none})
    if (name == positional_name(p)) return p;
  fail("positional: expected learned, sinusoidal, rope, alibi or none, got \"{}\"", name);
}

Norm parse_norm(const std::string& name) {
  if (name == "layernorm") return Norm::layernorm;
  if (name == "rmsnorm") return Norm::rmsnorm;
  fail("norm: expected layernorm or rmsnorm, got \"{}\"", name);
}

void validate(const GPTConfig& c) {
  check(c.vocab_size > 0, "vocab_size: must be positive, got {}", c.vocab_size);
  check(c.n_layer > 0, "n_layer: must be positive, got {}", c.n_layer);
  check(c.n_head > 0, "n_head: must be positive, got {}", c.n_head);
  check(c.n_embd > 0, "n_embd: must be positive, got {}", c.n_embd);
  check(c.block_size > 0, "block_size: must be positive, got {}", c.block_size);
  check(c.mlp_ratio > 0, "mlp_ratio: must be positive, got {}", c.mlp_ratio);
  check(c.n_embd % c.n_head == 0, "n_embd: {} is not divisible by n_head {}", c.n_embd, c.n_head);
  check(c.n_kv_head > 0 && c.n_head % c.n_kv_head == 0,
        "n_kv_head: {} must be positive and divide n_head {}", c.n_kv_head, c.n_head);
  check(c.positional != Positional::rope || c.head_dim() % 2 == 0,
        "positional: rope needs an even head_dim, got n_embd {} / n_head {} = {}", c.n_embd,
        c.n_head, c.head_dim());
  check(c.positional != Positional::sinusoidal || c.n_embd % 2 == 0,
        "positional: sinusoidal needs an even n_embd, got {}", c.n_embd);
  check(c.dropout >= 0.0f && c.dropout < 1.0f, "dropout: must be in [0, 1), got {}", c.dropout);
  check(std::isfinite(c.rope_base) && c.rope_base > 1.0f, "rope_base: must be > 1, got {}",
        c.rope_base);
  check(std::isfinite(c.norm_eps) && c.norm_eps > 0.0f, "norm_eps: must be positive, got {}",
        c.norm_eps);
  check(c.mlp_hidden >= 0, "mlp_hidden: must be ≥ 0, got {}", c.mlp_hidden);
  check(c.type_vocab_size >= 0, "type_vocab_size: must be ≥ 0, got {}", c.type_vocab_size);
  check(c.vocab_size < (int64_t{1} << 31), "vocab_size: {} does not fit 32-bit token ids",
        c.vocab_size);
  if (!c.layer_heads.empty() || !c.layer_kv_heads.empty()) {
    check(
        c.layer_heads.size() == static_cast<size_t>(c.n_layer) &&
            c.layer_kv_heads.size() == static_cast<size_t>(c.n_layer),
        "layer_heads: layer_heads and layer_kv_heads need one entry per layer ({}), got {} and {}",
        c.n_layer, c.layer_heads.size(), c.layer_kv_heads.size());
    check(c.positional != Positional::alibi,
          "layer_heads: ALiBi slopes follow the head count, so an alibi model cannot be pruned");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const int64_t h = c.heads(l), g = c.kv_heads(l);
      check(h >= 0 && h <= c.n_head, "layer_heads: layer {} has {} heads, outside [0, n_head {}]",
            l, h, c.n_head);
      if (c.layer_groups.empty())
        check(h == 0 ? g == 0 : (g > 0 && h % g == 0),
              "layer_kv_heads: layer {} has {} key/value heads for {} query heads (must divide "
              "them; 0 with 0)",
              l, g, h);
    }
  }
  if (!c.layer_groups.empty()) {
    check(c.layer_groups.size() == static_cast<size_t>(c.n_layer) && !c.layer_heads.empty(),
          "layer_groups: needs layer_heads and one entry per layer ({}), got {}", c.n_layer,
          c.layer_groups.size());
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const auto& groups = c.layer_groups[static_cast<size_t>(l)];
      int64_t sum = 0;
      for (int64_t n : groups) {
        check(n >= 1, "layer_groups: layer {} has a key/value head with {} query heads", l, n);
        sum += n;
      }
      check(static_cast<int64_t>(groups.size()) == c.kv_heads(l) && sum == c.heads(l),
            "layer_groups: layer {} has groups of {} query heads in all for {} key/value heads; "
            "layer_heads and layer_kv_heads say {} and {}",
            l, sum, groups.size(), c.heads(l), c.kv_heads(l));
    }
  }
}

std::vector<int64_t> GPTConfig::group_sizes(int64_t layer) const {
  if (!layer_groups.empty()) return layer_groups[static_cast<size_t>(layer)];
  const int64_t g = kv_heads(layer);
  return std::vector<int64_t>(static_cast<size_t>(g), g > 0 ? heads(layer) / g : 0);
}

bool GPTConfig::uniform_groups(int64_t layer) const {
  if (layer_groups.empty()) return true;
  const auto& groups = layer_groups[static_cast<size_t>(layer)];
  return std::all_of(groups.begin(), groups.end(), [&](int64_t n) { return n == groups[0]; });
}

std::string to_json(const GPTConfig& c) {
  nlohmann::ordered_json j;
  j["vocab_size"] = c.vocab_size;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_kv_head"] = c.n_kv_head;
  j["n_embd"] = c.n_embd;
  j["block_size"] = c.block_size;
  j["positional"] = positional_name(c.positional);
  j["norm"] = norm_name(c.norm);
  j["norm_first"] = c.norm_first;
  j["bias"] = c.bias;
  j["causal"] = c.causal;
  j["tied_embeddings"] = c.tied_embeddings;
  j["dropout"] = c.dropout;
  j["mlp_ratio"] = c.mlp_ratio;
  j["rope_base"] = c.rope_base;
  // Keys added since the first checkpoints are written only when they differ from the default, so
  // that a model of the original kind keeps its exact metadata.
  const GPTConfig defaults;
  if (c.norm_eps != defaults.norm_eps) j["norm_eps"] = c.norm_eps;
  if (c.activation != defaults.activation) j["activation"] = ops::activation_name(c.activation);
  if (c.mlp_hidden != defaults.mlp_hidden) j["mlp_hidden"] = c.mlp_hidden;
  if (c.type_vocab_size != defaults.type_vocab_size) j["type_vocab_size"] = c.type_vocab_size;
  if (c.embedding_norm != defaults.embedding_norm) j["embedding_norm"] = c.embedding_norm;
  if (c.lm_head != defaults.lm_head) j["lm_head"] = c.lm_head;
  if (!c.layer_heads.empty()) {
    j["layer_heads"] = c.layer_heads;
    j["layer_kv_heads"] = c.layer_kv_heads;
  }
  if (!c.layer_groups.empty()) j["layer_groups"] = c.layer_groups;
  return j.dump();
}

GPTConfig config_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("headlight.config: not valid JSON ({})", e.what());
  }
  check(j.is_object(), "headlight.config: expected a JSON object, got {}", j.type_name());
  GPTConfig c;
  auto get = [&](const char* key, auto& field, bool required) {
    if (!j.contains(key)) {
      check(!required, "headlight.config: missing \"{}\"", key);
      return;
    }
    try {
      j.at(key).get_to(field);
    } catch (const nlohmann::json::exception& e) {
      fail("headlight.config: \"{}\" has the wrong type ({})", key, e.what());
    }
  };
  get("vocab_size", c.vocab_size, true);
  get("n_layer", c.n_layer, true);
  get("n_head", c.n_head, true);
  c.n_kv_head = c.n_head;
  get("n_kv_head", c.n_kv_head, false);
  get("n_embd", c.n_embd, true);
  get("block_size", c.block_size, true);
  std::string positional = positional_name(c.positional), norm = norm_name(c.norm);
  get("positional", positional, false);
  get("norm", norm, false);
  c.positional = parse_positional(positional);
  c.norm = parse_norm(norm);
  get("norm_first", c.norm_first, false);
  get("bias", c.bias, false);
  get("causal", c.causal, false);
  get("tied_embeddings", c.tied_embeddings, false);
  get("dropout", c.dropout, false);
  get("mlp_ratio", c.mlp_ratio, false);
  get("rope_base", c.rope_base, false);
  get("norm_eps", c.norm_eps, false);
  std::string activation = ops::activation_name(c.activation);
  get("activation", activation, false);
  c.activation = ops::parse_activation(activation);
  get("mlp_hidden", c.mlp_hidden, false);
  get("type_vocab_size", c.type_vocab_size, false);
  get("embedding_norm", c.embedding_norm, false);
  get("lm_head", c.lm_head, false);
  get("layer_heads", c.layer_heads, false);
  get("layer_kv_heads", c.layer_kv_heads, false);
  get("layer_groups", c.layer_groups, false);
  validate(c);
  return c;
}

}  // namespace headlight::model

// The parameter layout of a GPT: names and shapes in the nanoGPT checkpoint layout.

#include "headlight/model/parameters.h"

#include <fmt/format.h>

namespace headlight::model {

ParameterLayout::ParameterLayout(const GPTConfig& c) {
  validate(c);
  const int64_t C = c.n_embd, V = c.vocab_size;
  const bool ln_bias = c.bias && c.norm == Norm::layernorm;
  add("transformer.wte.weight", {V, C}, false);
  if (c.positional == Positional::learned) add("transformer.wpe.weight", {c.block_size, C}, false);
  if (c.type_vocab_size > 0) add("transformer.wtt.weight", {c.type_vocab_size, C}, false);
  if (c.embedding_norm) {
    add("transformer.ln_e.weight", {C}, false);
    if (ln_bias) add("transformer.ln_e.bias", {C}, false);
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    add(p + "ln_1.weight", {C}, false);
    if (ln_bias) add(p + "ln_1.bias", {C}, false);
    add(p + "attn.c_attn.weight", {c.qkv_width(i), C}, true);
    if (c.bias) add(p + "attn.c_attn.bias", {c.qkv_width(i)}, false);
    add(p + "attn.c_proj.weight", {C, c.heads(i) * c.head_dim()}, true);
    if (c.bias) add(p + "attn.c_proj.bias", {C}, false);
    add(p + "ln_2.weight", {C}, false);
    if (ln_bias) add(p + "ln_2.bias", {C}, false);
    add(p + "mlp.c_fc.weight", {c.fc_width(), C}, true);
    if (c.bias) add(p + "mlp.c_fc.bias", {c.fc_width()}, false);
    add(p + "mlp.c_proj.weight", {C, c.mlp_width()}, true);
    if (c.bias) add(p + "mlp.c_proj.bias", {C}, false);
  }
  if (c.norm_first) {
    add("transformer.ln_f.weight", {C}, false);
    if (ln_bias) add("transformer.ln_f.bias", {C}, false);
  }
  if (c.lm_head && !c.tied_embeddings) add("lm_head.weight", {V, C}, true);
}

void ParameterLayout::add(std::string name, Shape shape, bool decay) {
  const int64_t n = checked_numel(shape, name);
  // Start every tensor on a 64-byte boundary (16 floats) so that SIMD loads of a row are aligned.
  total_ = (total_ + 15) / 16 * 16;
  entries_.push_back({std::move(name), std::move(shape), total_, n, decay});
  total_ += n;
}

const ParameterEntry* ParameterLayout::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ParameterEntry& ParameterLayout::at(const std::string& name) const {
  const ParameterEntry* e = find(name);
  check(e != nullptr, "parameter \"{}\": the model has no such tensor", name);
  return *e;
}

ModelOffsets model_offsets(const GPTConfig& c, const ParameterLayout& layout) {
  auto off = [&](const std::string& name) {
    const ParameterEntry* e = layout.find(name);
    return e ? e->offset : int64_t{-1};
  };
  ModelOffsets m;
  m.wte = off("transformer.wte.weight");
  m.wpe = off("transformer.wpe.weight");
  m.wtt = off("transformer.wtt.weight");
  m.lne_w = off("transformer.ln_e.weight");
  m.lne_b = off("transformer.ln_e.bias");
  m.lnf_w = off("transformer.ln_f.weight");
  m.lnf_b = off("transformer.ln_f.bias");
  m.lm_head = !c.lm_head ? -1 : c.tied_embeddings ? m.wte : off("lm_head.weight");
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    BlockOffsets b;
    b.ln1_w = off(p + "ln_1.weight");
    b.ln1_b = off(p + "ln_1.bias");
    b.attn_w = off(p + "attn.c_attn.weight");
    b.attn_b = off(p + "attn.c_attn.bias");
    b.proj_w = off(p + "attn.c_proj.weight");
    b.proj_b = off(p + "attn.c_proj.bias");
    b.ln2_w = off(p + "ln_2.weight");
    b.ln2_b = off(p + "ln_2.bias");
    b.fc_w = off(p + "mlp.c_fc.weight");
    b.fc_b = off(p + "mlp.c_fc.bias");
    b.fc_proj_w = off(p + "mlp.c_proj.weight");
    b.fc_proj_b = off(p + "mlp.c_proj.bias");
    m.blocks.push_back(b);
  }
  return m;
}

}  // namespace headlight::model

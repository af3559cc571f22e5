// Hugging Face folders: config.json mapped onto GPTConfig, the weights' names onto headlight's
// layout (load/model.h lists the architectures), tokenizer.json, tokenizer_config.json's chat
// template and sentence-transformers' modules.json.

#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "headlight/core/read_file.h"
#include "headlight/io/safetensors.h"
#include "headlight/load/model.h"
#include "headlight/train/checkpoint.h"
#include "src/load/json_fields.h"
#include "src/load/loaders.h"
#include "src/load/remap.h"

namespace headlight::load {

namespace {

namespace fs = std::filesystem;
using model::GPTConfig;

const char* const kSupported = "BertModel, GPT2LMHeadModel, LlamaForCausalLM";

ops::Activation activation_of(const JsonFields& f, const char* key, const std::string& fallback) {
  const std::string a = f.string(key, fallback);
  if (a == "gelu") return ops::Activation::gelu_erf;
  if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast")
    return ops::Activation::gelu_tanh;
  if (a == "relu") return ops::Activation::relu;
  fail("{}: \"{}\" is \"{}\"; supported: gelu, gelu_new, gelu_pytorch_tanh, relu", f.what(), key,
       a);
}

std::string layer(const char* pattern, int64_t i) {
  return fmt::format(fmt::runtime(pattern), i);
}

// Wq, Wk, Wv (each [rows, C]) stacked into c_attn, and their biases when `bias`.
void add_qkv(RemappedSource& r, const GPTConfig& c, int64_t i, const std::string& q,
             const std::string& k, const std::string& v, bool bias, int64_t unpermute = 0) {
  const int64_t C = c.n_embd, hd = c.head_dim(), H = c.n_head, G = c.n_kv_head;
  const std::string t = fmt::format("transformer.h.{}.attn.c_attn.", i);
  r.add(t + "weight", {c.qkv_width(i), C},
        {{.name = q + ".weight", .shape = {H * hd, C}, .unpermute_heads = unpermute ? H : 0},
         {.name = k + ".weight", .shape = {G * hd, C}, .unpermute_heads = unpermute ? G : 0},
         {.name = v + ".weight", .shape = {G * hd, C}}});
  if (bias)
    r.add(t + "bias", {c.qkv_width(i)},
          {{.name = q + ".bias", .shape = {H * hd}},
           {.name = k + ".bias", .shape = {G * hd}},
           {.name = v + ".bias", .shape = {G * hd}}});
}

// A [out, in] linear layer (and its bias) under a headlight name.
void add_linear(RemappedSource& r, const std::string& to, const std::string& from, int64_t out,
                int64_t in, bool bias, bool conv1d = false) {
  r.add(to + ".weight", {out, in},
        {{.name = from + ".weight",
          .shape = conv1d ? Shape{in, out} : Shape{out, in},
          .transpose = conv1d}});
  if (bias) r.add(to + ".bias", {out}, {{.name = from + ".bias", .shape = {out}}});
}

void add_norm(RemappedSource& r, const std::string& to, const std::string& from, int64_t C,
              bool bias) {
  r.add(to + ".weight", {C}, {{.name = from + ".weight", .shape = {C}}});
  if (bias) r.add(to + ".bias", {C}, {{.name = from + ".bias", .shape = {C}}});
}

GPTConfig bert(const JsonFields& f, RemappedSource& r) {
  check(f.string("position_embedding_type", "absolute") == "absolute",
        "{}: \"position_embedding_type\" \"{}\" is not supported (absolute only)", f.what(),
        f.string("position_embedding_type", ""));
  check(!f.boolean("is_decoder", false), "{}: \"is_decoder\" BERT models are not supported",
        f.what());
  GPTConfig c{.vocab_size = f.size("vocab_size"),
              .n_layer = f.size("num_hidden_layers"),
              .n_head = f.size("num_attention_heads"),
              .n_kv_head = f.size("num_attention_heads"),
              .n_embd = f.size("hidden_size"),
              .block_size = f.size("max_position_embeddings"),
              .positional = model::Positional::learned,
              .norm = model::Norm::layernorm,
              .norm_first = false,
              .bias = true,
              .causal = false,
              .tied_embeddings = true,
              .norm_eps = static_cast<float>(f.number("layer_norm_eps", 1e-12)),
              .activation = activation_of(f, "hidden_act", "gelu"),
              .mlp_hidden = f.size("intermediate_size"),
              .type_vocab_size = f.integer("type_vocab_size", 2),
              .embedding_norm = true,
              .lm_head = false};
  check(c.n_embd % c.n_head == 0, "{}: hidden_size {} is not divisible by num_attention_heads {}",
        f.what(), c.n_embd, c.n_head);
  const std::string p = r.has("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  const int64_t C = c.n_embd, F = c.mlp_width();
  r.add("transformer.wte.weight", {c.vocab_size, C},
        {{.name = p + "embeddings.word_embeddings.weight", .shape = {c.vocab_size, C}}});
  r.add("transformer.wpe.weight", {c.block_size, C},
        {{.name = p + "embeddings.position_embeddings.weight", .shape = {c.block_size, C}}});
  if (c.type_vocab_size > 0)
    r.add(
        "transformer.wtt.weight", {c.type_vocab_size, C},
        {{.name = p + "embeddings.token_type_embeddings.weight", .shape = {c.type_vocab_size, C}}});
  add_norm(r, "transformer.ln_e", p + "embeddings.LayerNorm", C, true);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string l = p + layer("encoder.layer.{}.", i);
    const std::string t = layer("transformer.h.{}.", i);
    add_qkv(r, c, i, l + "attention.self.query", l + "attention.self.key",
            l + "attention.self.value", true);
    add_linear(r, t + "attn.c_proj", l + "attention.output.dense", C, C, true);
    add_norm(r, t + "ln_1", l + "attention.output.LayerNorm", C, true);
    add_linear(r, t + "mlp.c_fc", l + "intermediate.dense", F, C, true);
    add_linear(r, t + "mlp.c_proj", l + "output.dense", C, F, true);
    add_norm(r, t + "ln_2", l + "output.LayerNorm", C, true);
  }
  return c;
}

GPTConfig gpt2(const JsonFields& f, RemappedSource& r) {
  check(
      !f.boolean("scale_attn_by_inverse_layer_idx", false) && f.boolean("scale_attn_weights", true),
      "{}: GPT-2 attention scaled other than by 1/√head_dim is not supported", f.what());
  const int64_t C = f.size("n_embd");
  GPTConfig c{.vocab_size = f.size("vocab_size"),
              .n_layer = f.size("n_layer"),
              .n_head = f.size("n_head"),
              .n_kv_head = f.size("n_head"),
              .n_embd = C,
              .block_size = f.size("n_positions"),
              .positional = model::Positional::learned,
              .norm = model::Norm::layernorm,
              .norm_first = true,
              .bias = true,
              .causal = true,
              .tied_embeddings = f.boolean("tie_word_embeddings", true),
              .norm_eps = static_cast<float>(f.number("layer_norm_epsilon", 1e-5)),
              .activation = activation_of(f, "activation_function", "gelu_new"),
              .mlp_hidden = f.integer("n_inner", 4 * C)};
  check(C % c.n_head == 0, "{}: n_embd {} is not divisible by n_head {}", f.what(), C, c.n_head);
  const std::string p = r.has("transformer.wte.weight") ? "transformer." : "";
  const int64_t F = c.mlp_width();
  r.add("transformer.wte.weight", {c.vocab_size, C},
        {{.name = p + "wte.weight", .shape = {c.vocab_size, C}}});
  r.add("transformer.wpe.weight", {c.block_size, C},
        {{.name = p + "wpe.weight", .shape = {c.block_size, C}}});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string l = p + layer("h.{}.", i);
    const std::string t = layer("transformer.h.{}.", i);
    add_norm(r, t + "ln_1", l + "ln_1", C, true);
    add_linear(r, t + "attn.c_attn", l + "attn.c_attn", 3 * C, C, true, true);
    add_linear(r, t + "attn.c_proj", l + "attn.c_proj", C, C, true, true);
    add_norm(r, t + "ln_2", l + "ln_2", C, true);
    add_linear(r, t + "mlp.c_fc", l + "mlp.c_fc", F, C, true, true);
    add_linear(r, t + "mlp.c_proj", l + "mlp.c_proj", C, F, true, true);
  }
  add_norm(r, "transformer.ln_f", p + "ln_f", C, true);
  if (!c.tied_embeddings)
    r.add("lm_head.weight", {c.vocab_size, C},
          {{.name = "lm_head.weight", .shape = {c.vocab_size, C}}});
  return c;
}

GPTConfig llama(const JsonFields& f, RemappedSource& r) {
  // rope_theta (transformers 4) or rope_parameters {rope_theta, rope_type} (transformers 5).
  double theta = f.number("rope_theta", 10000.0);
  if (f.has("rope_parameters")) {
    const JsonFields rp(f.at("rope_parameters"), f.what() + " rope_parameters");
    theta = rp.number("rope_theta", theta);
    check(rp.string("rope_type", "default") == "default",
          "{}: rope_type \"{}\" is not supported (default rotary embeddings only)", f.what(),
          rp.string("rope_type", ""));
  }
  check(!f.has("rope_scaling"), "{}: \"rope_scaling\" is not supported", f.what());
  check(!f.boolean("attention_bias", false) && !f.boolean("mlp_bias", false),
        "{}: attention_bias / mlp_bias are not supported for Llama models", f.what());
  const std::string act = f.string("hidden_act", "silu");
  check(act == "silu", "{}: \"hidden_act\" is \"{}\"; Llama models need silu", f.what(), act);
  const int64_t C = f.size("hidden_size"), H = f.size("num_attention_heads");
  GPTConfig c{.vocab_size = f.size("vocab_size"),
              .n_layer = f.size("num_hidden_layers"),
              .n_head = H,
              .n_kv_head = f.integer("num_key_value_heads", H),
              .n_embd = C,
              .block_size = f.size("max_position_embeddings"),
              .positional = model::Positional::rope,
              .norm = model::Norm::rmsnorm,
              .norm_first = true,
              .bias = false,
              .causal = true,
              .tied_embeddings = f.boolean("tie_word_embeddings", false),
              .rope_base = static_cast<float>(theta),
              .norm_eps = static_cast<float>(f.number("rms_norm_eps", 1e-6)),
              .activation = ops::Activation::swiglu,
              .mlp_hidden = f.size("intermediate_size")};
  check(C % H == 0 && f.integer("head_dim", C / H) == C / H,
        "{}: head_dim {} other than hidden_size / num_attention_heads ({} / {}) is not supported",
        f.what(), f.integer("head_dim", 0), C, H);
  check(c.n_kv_head > 0 && H % c.n_kv_head == 0,
        "{}: num_key_value_heads {} does not divide num_attention_heads {}", f.what(), c.n_kv_head,
        H);
  const int64_t F = c.mlp_width(), hd = c.head_dim();
  r.add("transformer.wte.weight", {c.vocab_size, C},
        {{.name = "model.embed_tokens.weight", .shape = {c.vocab_size, C}}});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string l = layer("model.layers.{}.", i);
    const std::string t = layer("transformer.h.{}.", i);
    add_norm(r, t + "ln_1", l + "input_layernorm", C, false);
    add_qkv(r, c, i, l + "self_attn.q_proj", l + "self_attn.k_proj", l + "self_attn.v_proj", false);
    add_linear(r, t + "attn.c_proj", l + "self_attn.o_proj", C, H * hd, false);
    add_norm(r, t + "ln_2", l + "post_attention_layernorm", C, false);
    r.add(t + "mlp.c_fc.weight", {2 * F, C},
          {{.name = l + "mlp.gate_proj.weight", .shape = {F, C}},
           {.name = l + "mlp.up_proj.weight", .shape = {F, C}}});
    add_linear(r, t + "mlp.c_proj", l + "mlp.down_proj", C, F, false);
  }
  add_norm(r, "transformer.ln_f", "model.norm", C, false);
  if (!c.tied_embeddings)
    r.add("lm_head.weight", {c.vocab_size, C},
          {{.name = "lm_head.weight", .shape = {c.vocab_size, C}}});
  return c;
}

// eos_token_id as an integer or a list of them.
void read_eos(const JsonFields& f, std::vector<int32_t>& eos) {
  if (!f.has("eos_token_id")) return;
  const auto& v = f.at("eos_token_id");
  eos.clear();
  if (v.is_number_integer()) eos.push_back(v.get<int32_t>());
  if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) eos.push_back(e.get<int32_t>());
}

// sentence-transformers: modules.json lists a Pooling module (its config.json) and Normalize.
void read_sentence_transformers(const fs::path& dir, Model& m) {
  const fs::path modules = dir / "modules.json";
  if (!fs::exists(modules)) return;
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(read_file(modules.string()));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", modules.string(), e.what());
  }
  check(list.is_array(), "{}: expected a list of modules", modules.string());
  for (const auto& mod : list) {
    check(mod.is_object() && mod.contains("type") && mod["type"].is_string(),
          "{}: a module without a \"type\"", modules.string());
    const std::string type = mod["type"].get<std::string>();
    const std::string sub = mod.value("path", std::string());
    if (type.ends_with(".Pooling")) {
      const std::string cfg_path = (dir / sub / "config.json").string();
      const nlohmann::json j = read_json_object(cfg_path);
      const JsonFields f(j, cfg_path);
      const bool cls = f.boolean("pooling_mode_cls_token", false);
      const bool mean = f.boolean("pooling_mode_mean_tokens", false);
      for (const char* other : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"})
        check(!f.boolean(other, false), "{}: \"{}\" is not supported (cls or mean only)", cfg_path,
              other);
      check(cls != mean, "{}: exactly one of pooling_mode_cls_token and pooling_mode_mean_tokens",
            cfg_path);
      m.pooling.mode = cls ? Pooling::Mode::cls : Pooling::Mode::mean;
    } else if (type.ends_with(".Normalize")) {
      m.pooling.normalize = true;
    } else {
      check(type.ends_with(".Transformer"), "{}: module \"{}\" is not supported", modules.string(),
            type);
    }
  }
  const fs::path sbert = dir / "sentence_bert_config.json";
  if (fs::exists(sbert)) {
    const nlohmann::json j = read_json_object(sbert.string());
    const int64_t n = JsonFields(j, sbert.string()).integer("max_seq_length", m.max_seq_length);
    check(n > 0, "{}: \"max_seq_length\" must be positive, got {}", sbert.string(), n);
    m.max_seq_length = std::min(m.max_seq_length, n);
  }
}

}  // namespace

Model load_hf_folder(const std::string& path) {
  const fs::path dir(path);
  const std::string config_path = (dir / "config.json").string();
  check(fs::exists(config_path), "{}: not a Hugging Face model folder (no config.json)", path);
  const nlohmann::json j = read_json_object(config_path);
  const JsonFields f(j, config_path);
  std::string arch;
  if (f.has("architectures") && f.at("architectures").is_array() &&
      !f.at("architectures").empty() && f.at("architectures")[0].is_string())
    arch = f.at("architectures")[0].get<std::string>();
  else
    arch = f.string("model_type", "");
  enum { kBert, kGpt2, kLlama } kind;
  if (arch.starts_with("Bert") || arch == "bert")
    kind = kBert;
  else if (arch == "GPT2LMHeadModel" || arch == "GPT2Model" || arch == "gpt2")
    kind = kGpt2;
  else if (arch == "LlamaForCausalLM" || arch == "llama")
    kind = kLlama;
  else
    fail("{}: architecture \"{}\" is not supported (supported: {})", config_path, arch, kSupported);

  std::unique_ptr<TensorSource> weights;
  std::string weights_name;
  if (fs::exists(dir / "model.safetensors")) {
    weights_name = (dir / "model.safetensors").string();
    weights = std::make_unique<io::SafetensorsFile>(weights_name);
  } else if (fs::exists(dir / "model.safetensors.index.json")) {
    weights_name = (dir / "model.safetensors.index.json").string();
    weights = std::make_unique<io::ShardedSafetensors>(weights_name);
  } else {
    fail(
        "{}: no model.safetensors or model.safetensors.index.json (other weight formats are not "
        "read)",
        path);
  }
  // A folder headlight wrote (write_model: pruned heads) holds a headlight checkpoint; the rest
  // (tokenizer, pooling, chat template, end tokens) is the original folder's.
  const auto* single = dynamic_cast<const io::SafetensorsFile*>(weights.get());
  std::optional<model::GPT> net;
  std::vector<std::pair<std::string, int64_t>> stored;
  if (single && single->metadata("headlight.config").has_value()) {
    net.emplace(std::move(train::load_model(weights_name).model));
    stored = stored_dtypes(*single, *net);
  } else {
    RemappedSource r(*weights, weights_name);
    const GPTConfig rc = kind == kBert ? bert(f, r) : kind == kGpt2 ? gpt2(f, r) : llama(f, r);
    try {
      model::validate(rc);
    } catch (const Error& e) {
      fail("{}: {}", config_path, e.what());
    }
    net.emplace(rc, r);
    stored = stored_dtypes(r, *net);
  }
  const GPTConfig c = net->config();
  Model m{.path = path,
          .format = Format::hf_folder,
          .architecture = arch,
          .net = std::move(*net),
          .max_seq_length = c.block_size,
          .stored_dtypes = std::move(stored)};
  read_eos(f, m.eos_ids);
  m.bos_id = static_cast<int32_t>(f.integer("bos_token_id", -1));
  if (fs::exists(dir / "generation_config.json")) {
    const nlohmann::json g = read_json_object((dir / "generation_config.json").string());
    read_eos(JsonFields(g, (dir / "generation_config.json").string()), m.eos_ids);
  }
  const fs::path tok = dir / "tokenizer.json";
  if (fs::exists(tok)) {
    try {
      m.tokenizer = model::TextTokenizer::from_hf_json(read_file(tok.string()), tok.string());
    } catch (const Error& e) {
      m.tokenizer_error = e.what();
    }
    if (m.tokenizer)
      check(m.tokenizer->vocab_size() <= c.vocab_size,
            "{}: the tokenizer has {} tokens, more than config.json's vocab_size {}", tok.string(),
            m.tokenizer->vocab_size(), c.vocab_size);
  } else {
    m.tokenizer_error = fmt::format("{}: no tokenizer.json", path);
  }
  const fs::path tc = dir / "tokenizer_config.json";
  if (fs::exists(tc)) {
    const nlohmann::json t = read_json_object(tc.string());
    if (t.contains("chat_template") && t["chat_template"].is_string())
      m.chat_template = t["chat_template"].get<std::string>();
  }
  if (m.chat_template.empty() && fs::exists(dir / "chat_template.jinja"))
    m.chat_template = read_file((dir / "chat_template.jinja").string());
  if (kind == kBert) read_sentence_transformers(dir, m);
  return m;
}

}  // namespace headlight::load

// GGUF files: the architecture's metadata ("<arch>.block_count", …) mapped onto GPTConfig and
// llama.cpp's tensor names ("blk.N.attn_q.weight", …) onto headlight's layout. llama.cpp's
// converter permutes the rows of the q and k projections of llama models so that rotary pairs are
// adjacent; headlight (as transformers) rotates the halves of each head, so the permutation is
// undone here.

#include <memory>

#include <fmt/format.h>

#include "headlight/io/gguf.h"
#include "headlight/load/gguf_tokenizer.h"
#include "headlight/load/model.h"
#include "src/load/loaders.h"
#include "src/load/remap.h"

namespace headlight::load {

namespace {

using model::GPTConfig;

class Meta {
 public:
  Meta(const io::GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  int64_t size(const std::string& key) const {
    const std::string k = arch_ + "." + key;
    const io::GgufValue* v = f_.value(k);
    check(v != nullptr, "{}: missing metadata \"{}\"", f_.path(), k);
    const int64_t n = v->as_int(k);
    check(n > 0, "{}: metadata \"{}\" must be positive, got {}", f_.path(), k, n);
    return n;
  }
  int64_t size(const std::string& key, int64_t fallback) const {
    return f_.value(arch_ + "." + key) ? size(key) : fallback;
  }
  double number(const std::string& key, double fallback) const {
    const std::string k = arch_ + "." + key;
    const io::GgufValue* v = f_.value(k);
    return v ? v->as_float(k) : fallback;
  }

 private:
  const io::GgufFile& f_;
  std::string arch_;
};

std::string blk(int64_t i, const char* name) {
  return fmt::format("blk.{}.{}", i, name);
}

void add(RemappedSource& r, const std::string& to, const std::string& from, const Shape& shape,
         int64_t unpermute = 0) {
  r.add(to, shape, {{.name = from, .shape = shape, .unpermute_heads = unpermute}});
}

int64_t vocab_rows(const io::GgufFile& f) {
  check(f.contains("token_embd.weight"), "{}: missing tensor \"token_embd.weight\"", f.path());
  const Shape s = f.shape("token_embd.weight");
  check(s.size() == 2, "{}: \"token_embd.weight\" has shape {}, expected [vocab, embedding]",
        f.path(), shape_string(s));
  return s[0];
}

GPTConfig llama(const io::GgufFile& f, RemappedSource& r) {
  const Meta m(f, "llama");
  const int64_t H = m.size("attention.head_count");
  GPTConfig c{.vocab_size = vocab_rows(f),
              .n_layer = m.size("block_count"),
              .n_head = H,
              .n_kv_head = m.size("attention.head_count_kv", H),
              .n_embd = m.size("embedding_length"),
              .block_size = m.size("context_length"),
              .positional = model::Positional::rope,
              .norm = model::Norm::rmsnorm,
              .norm_first = true,
              .bias = false,
              .causal = true,
              .tied_embeddings = !f.contains("output.weight"),
              .rope_base = static_cast<float>(m.number("rope.freq_base", 10000.0)),
              .norm_eps = static_cast<float>(m.number("attention.layer_norm_rms_epsilon", 1e-5)),
              .activation = ops::Activation::swiglu,
              .mlp_hidden = m.size("feed_forward_length")};
  check(c.n_embd % H == 0 && m.size("rope.dimension_count", c.n_embd / H) == c.n_embd / H,
        "{}: llama.rope.dimension_count other than the head size is not supported", f.path());
  model::validate(c);
  const int64_t C = c.n_embd, G = c.n_kv_head, hd = c.head_dim(), F = c.mlp_width();
  add(r, "transformer.wte.weight", "token_embd.weight", {c.vocab_size, C});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string t = fmt::format("transformer.h.{}.", i);
    add(r, t + "ln_1.weight", blk(i, "attn_norm.weight"), {C});
    r.add(t + "attn.c_attn.weight", {c.qkv_width(i), C},
          {{.name = blk(i, "attn_q.weight"), .shape = {H * hd, C}, .unpermute_heads = H},
           {.name = blk(i, "attn_k.weight"), .shape = {G * hd, C}, .unpermute_heads = G},
           {.name = blk(i, "attn_v.weight"), .shape = {G * hd, C}}});
    add(r, t + "attn.c_proj.weight", blk(i, "attn_output.weight"), {C, H * hd});
    add(r, t + "ln_2.weight", blk(i, "ffn_norm.weight"), {C});
    r.add(t + "mlp.c_fc.weight", {2 * F, C},
          {{.name = blk(i, "ffn_gate.weight"), .shape = {F, C}},
           {.name = blk(i, "ffn_up.weight"), .shape = {F, C}}});
    add(r, t + "mlp.c_proj.weight", blk(i, "ffn_down.weight"), {C, F});
  }
  add(r, "transformer.ln_f.weight", "output_norm.weight", {C});
  if (!c.tied_embeddings) add(r, "lm_head.weight", "output.weight", {c.vocab_size, C});
  return c;
}

GPTConfig gpt2(const io::GgufFile& f, RemappedSource& r) {
  const Meta m(f, "gpt2");
  const int64_t H = m.size("attention.head_count"), C = m.size("embedding_length");
  GPTConfig c{.vocab_size = vocab_rows(f),
              .n_layer = m.size("block_count"),
              .n_head = H,
              .n_kv_head = H,
              .n_embd = C,
              .block_size = m.size("context_length"),
              .positional = model::Positional::learned,
              .norm = model::Norm::layernorm,
              .norm_first = true,
              .bias = true,
              .causal = true,
              .tied_embeddings = !f.contains("output.weight"),
              .norm_eps = static_cast<float>(m.number("attention.layer_norm_epsilon", 1e-5)),
              .activation = ops::Activation::gelu_tanh,
              .mlp_hidden = m.size("feed_forward_length", 4 * C)};
  model::validate(c);
  const int64_t F = c.mlp_width();
  add(r, "transformer.wte.weight", "token_embd.weight", {c.vocab_size, C});
  add(r, "transformer.wpe.weight", "position_embd.weight", {c.block_size, C});
  auto linear = [&](const std::string& to, int64_t i, const char* from, int64_t out, int64_t in) {
    add(r, to + ".weight", blk(i, from) + ".weight", {out, in});
    add(r, to + ".bias", blk(i, from) + ".bias", {out});
  };
  auto norm = [&](const std::string& to, const std::string& from) {
    add(r, to + ".weight", from + ".weight", {C});
    add(r, to + ".bias", from + ".bias", {C});
  };
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string t = fmt::format("transformer.h.{}.", i);
    norm(t + "ln_1", blk(i, "attn_norm"));
    linear(t + "attn.c_attn", i, "attn_qkv", 3 * C, C);
    linear(t + "attn.c_proj", i, "attn_output", C, C);
    norm(t + "ln_2", blk(i, "ffn_norm"));
    linear(t + "mlp.c_fc", i, "ffn_up", F, C);
    linear(t + "mlp.c_proj", i, "ffn_down", C, F);
  }
  norm("transformer.ln_f", "output_norm");
  if (!c.tied_embeddings) add(r, "lm_head.weight", "output.weight", {c.vocab_size, C});
  return c;
}

}  // namespace

Model load_gguf(const std::string& path) {
  io::GgufFile f(path);
  const io::GgufValue* a = f.value("general.architecture");
  check(a != nullptr, "{}: missing metadata \"general.architecture\"", path);
  const std::string arch = a->as_string("general.architecture");
  RemappedSource r(f, path);
  GPTConfig c;
  try {
    if (arch == "llama")
      c = llama(f, r);
    else if (arch == "gpt2")
      c = gpt2(f, r);
    else
      fail("general.architecture \"{}\" is not supported (supported: llama, gpt2)", arch);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.starts_with(path)) throw;
    fail("{}: {}", path, what);
  }
  Model m{.path = path,
          .format = Format::gguf,
          .architecture = arch,
          .net = model::GPT(c, r),
          .max_seq_length = c.block_size};
  m.stored_dtypes = stored_dtypes(r, m.net);
  try {
    m.tokenizer = model::TextTokenizer(tokenizer_from_gguf(f));
    check(m.tokenizer->vocab_size() <= c.vocab_size,
          "{}: the tokenizer has {} tokens, more than the {} rows of token_embd.weight", path,
          m.tokenizer->vocab_size(), c.vocab_size);
  } catch (const Error& e) {
    m.tokenizer.reset();
    m.tokenizer_error = e.what();
  }
  if (const io::GgufValue* t = f.value("tokenizer.chat_template"))
    m.chat_template = t->as_string("tokenizer.chat_template");
  if (const io::GgufValue* e = f.value("tokenizer.ggml.eos_token_id"))
    m.eos_ids.push_back(static_cast<int32_t>(e->as_int("tokenizer.ggml.eos_token_id")));
  if (const io::GgufValue* b = f.value("tokenizer.ggml.bos_token_id"))
    m.bos_id = static_cast<int32_t>(b->as_int("tokenizer.ggml.bos_token_id"));
  return m;
}

}  // namespace headlight::load

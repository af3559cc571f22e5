// headlight info / embed: what a model is, and sentence embeddings from an encoder. MODEL is a
// headlight checkpoint, a Hugging Face folder or a GGUF file (load/model.h).

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "headlight/inspect/capture.h"
#include "headlight/load/chat.h"
#include "headlight/load/embed.h"
#include "headlight/load/model.h"
#include "options.h"

namespace headlight::cli {

namespace {

std::string chat_name(const load::Model& m) {
  if (m.chat_template.empty()) return "none";
  try {
    return load::ChatTemplate::recognise(m.chat_template, m.path).name();
  } catch (const Error&) {
    return "present, not recognised (--chat refuses it)";
  }
}

nlohmann::ordered_json info_json(const load::Model& m) {
  const model::GPTConfig& c = m.net.config();
  const int64_t params = m.net.layout().total();
  nlohmann::ordered_json j;
  j["path"] = m.path;
  j["format"] = load::format_name(m.format);
  j["architecture"] = m.architecture;
  j["kind"] = c.lm_head ? (c.causal ? "decoder" : "encoder with an LM head") : "encoder";
  j["layers"] = c.n_layer;
  j["heads"] = c.n_head;
  j["kv_heads"] = c.n_kv_head;
  if (!c.layer_heads.empty()) {  // pruned: what each layer kept
    j["pruned"] = fmt::format("{} of {} heads kept", c.total_heads(), c.n_layer * c.n_head);
    j["layer_heads"] = c.layer_heads;
    j["layer_kv_heads"] = c.layer_kv_heads;
  }
  j["head_dim"] = c.head_dim();
  j["width"] = c.n_embd;
  j["mlp_width"] = c.mlp_width();
  j["activation"] = ops::activation_name(c.activation);
  j["norm"] = fmt::format("{} (eps {:g}), {}", model::norm_name(c.norm), c.norm_eps,
                          c.norm_first ? "pre-norm" : "post-norm");
  j["positions"] = c.positional == model::Positional::rope
                       ? fmt::format("rope (base {:g})", c.rope_base)
                       : model::positional_name(c.positional);
  j["context"] = c.block_size;
  j["vocab_size"] = c.vocab_size;
  j["output_head"] = !c.lm_head ? "none (hidden states)" : c.tied_embeddings ? "tied" : "separate";
  j["parameters"] = params;
  // "BF16", or "Q4_K 71.2%, Q6_K 14.0%, F32 <0.1%" by share of the parameters: the weights' types
  // in the files (they are read as float32)
  auto types = m.stored_dtypes;
  std::stable_sort(types.begin(), types.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string stored;
  for (const auto& [type, n] : types) {
    const double share =
        100.0 * static_cast<double>(n) / static_cast<double>(std::max<int64_t>(params, 1));
    stored += (stored.empty() ? "" : ", ") + type;
    if (types.size() > 1) stored += share < 0.1 ? " <0.1%" : fmt::format(" {:.1f}%", share);
  }
  j["stored_as"] = stored + " (read as float32)";
  j["memory_bytes"] = params * 4;
  j["tokenizer"] =
      m.tokenizer
          ? fmt::format("{}, {} tokens", m.tokenizer->kind(), m.tokenizer->vocab_size())
          : "none" + (m.tokenizer_error.empty() ? std::string() : " (" + m.tokenizer_error + ")");
  if (m.pooling.mode != load::Pooling::Mode::none)
    j["pooling"] = fmt::format("{}{}", load::pooling_name(m.pooling.mode),
                               m.pooling.normalize ? ", L2-normalised" : "");
  j["max_seq_length"] = m.max_seq_length;
  j["chat_template"] = chat_name(m);
  j["eos_token_ids"] = m.eos_ids;
  return j;
}

// A progress bar on stderr, redrawn in place when stderr is a terminal and every tenth otherwise.
class Progress {
 public:
  explicit Progress(int64_t total) : total_(total), tty_(isatty(fileno(stderr)) != 0) {}
  void operator()(int64_t done, int64_t) {
    const int64_t tenth = done * 10 / total_;
    if (!tty_ && tenth == last_tenth_) return;
    last_tenth_ = tenth;
    const int width = 30;
    const int filled = static_cast<int>(done * width / total_);
    fmt::print(stderr, "{}[{}{}] {}/{} texts{}", tty_ ? "\r" : "", std::string(filled, '#'),
               std::string(width - filled, '.'), done, total_, tty_ && done < total_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  int64_t total_;
  bool tty_;
  int64_t last_tenth_ = -1;
};

}  // namespace

void add_info(CLI::App& app) {
  struct Args {
    std::string model;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("info", "What a model is: architecture, sizes, heads, tokenizer, memory");
  cmd->add_option("model", a->model, "Checkpoint, Hugging Face folder or .gguf file")->required();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    const load::Model m = load::load_model(a->model);
    const auto j = info_json(m);
    if (a->json) {
      fmt::print("{}\n", j.dump(2));
      return;
    }
    for (const auto& [key, value] : j.items())
      fmt::print("{:<15} {}\n", key + ":",
                 value.is_string() ? value.get<std::string>() : value.dump());
  });
}

void add_embed(CLI::App& app) {
  struct Args {
    std::string model, input, out;
    int64_t batch_size = 32;
    int threads = 0;
    std::string dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "embed", "Sentence embeddings of an encoder (one text per line) into a .npy file");
  cmd->add_option("model", a->model, "Hugging Face folder (sentence-transformers) or checkpoint")
      ->required();
  cmd->add_option("--input", a->input, "Text file, one text per line")->required();
  cmd->add_option("--out", a->out, "Output .npy file, float32 [texts, width]")->required();
  positive(
      cmd->add_option("--batch-size", a->batch_size, "Texts per forward")->capture_default_str());
  add_threads_option(cmd, a->threads);
  add_dtype_option(cmd, a->dtype);
  cmd->callback([a] {
    std::ifstream in(a->input, std::ios::binary);
    check(in.good(), "--input: {} cannot be read", a->input);
    std::vector<std::string> texts;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      texts.push_back(line);
    }
    check(!texts.empty(), "--input: {} has no lines", a->input);
    AtomicFile out(a->out);  // opened first: a bad path fails before the work
    load::Model m = load::load_model(a->model);
    m.net.set_dtype(parse_dtype(a->dtype, "--dtype"));
    ThreadContext ctx(a->threads);
    Progress progress(static_cast<int64_t>(texts.size()));
    load::EmbedOptions o{.batch_size = a->batch_size};
    if (texts.size() >= 64) o.progress = std::ref(progress);
    const Tensor e = load::embed_texts(ctx, m, texts, o);
    inspect::write_npy(out, e.data(), e.shape());
    fmt::print("{}: {} embeddings of {} floats\n", a->out, e.shape()[0], e.shape()[1]);
  });
}

}  // namespace headlight::cli

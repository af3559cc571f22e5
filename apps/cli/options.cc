// Shared CLI options and numeric checks (see options.h).

#include "options.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "headlight/core/error.h"

namespace headlight::cli {

namespace {

// A CLI11 check of a number: `ok(x)` or the message `want` (the parser prefixes the option's
// name).
template <typename Ok>
CLI::Validator number_check(std::string name, std::string want, Ok ok) {
  return CLI::Validator(
      [want, ok](std::string& text) -> std::string {
        double x = 0;
        size_t used = 0;
        try {
          x = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != text.size() || text.empty())
          return fmt::format("expected a number, got {}", text);
        if (std::isnan(x) || !ok(x)) return fmt::format("must be {}, got {}", want, text);
        return {};
      },
      "", std::move(name));
}

std::string number(double x) {
  return fmt::format("{}", x);
}

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

CLI::Option* at_least(CLI::Option* opt, double lo) {
  return opt->check(
      number_check("at_least", "at least " + number(lo), [lo](double x) { return x >= lo; }));
}

CLI::Option* positive(CLI::Option* opt) {
  return opt->check(number_check("positive", "positive", [](double x) { return x > 0; }));
}

CLI::Option* in_range(CLI::Option* opt, double lo, double hi) {
  return opt->check(number_check("in_range", fmt::format("in [{}, {}]", lo, hi),
                                 [lo, hi](double x) { return x >= lo && x <= hi; }));
}

CLI::Option* below_one(CLI::Option* opt) {
  return opt->check(
      number_check("below_one", "in [0, 1)", [](double x) { return x >= 0 && x < 1; }));
}

CLI::Option* add_threads_option(CLI::App* cmd, int& threads, int default_threads) {
  threads = default_threads;
  const int most = hardware_threads();
  return cmd->add_option("--threads", threads, "Threads (0: all)")
      ->capture_default_str()
      ->check(number_check(
          "threads", fmt::format("between 0 (all) and this machine's {} hardware threads", most),
          [most](double x) { return x >= 0 && x <= most && x == std::floor(x); }));
}

CLI::Option* add_dtype_option(CLI::App* cmd, std::string& dtype, bool training) {
  return cmd
      ->add_option("--dtype", dtype,
                   training ? "Dense products in f32, or bf16 (mixed precision: bf16 products with "
                              "fp32 accumulation, fp32 master weights, AdamW state, norms, "
                              "attention and loss)"
                            : "Dense products in f32, or bf16 (weights and inputs rounded, fp32 "
                              "accumulation)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
}

CLI::Option* add_micro_batches_option(CLI::App* cmd, int64_t& micro_batches) {
  return at_least(cmd->add_option("--micro-batches", micro_batches,
                                  "Micro-batches per step, each forward and backward whole on one "
                                  "thread (0: from the shape, 1: the whole batch at once; must "
                                  "divide --batch)")
                      ->capture_default_str(),
                  0);
}

void add_corpus_shape_options(CLI::App* cmd, train::CorpusOptions& shape) {
  at_least(
      cmd->add_option("--references", shape.references, "Pronoun sentences per detective story")
          ->capture_default_str(),
      1);
  in_range(cmd->add_option("--drills", shape.drills,
                           "Fraction of detective stories followed by a recall line")
               ->capture_default_str(),
           0, 1);
  in_range(
      cmd->add_option("--drill-words", shape.drill_words, "Longest recall line, in words (4..64)")
          ->capture_default_str(),
      4, 64);
  cmd->add_flag("--drill-log-lengths", shape.drill_log_lengths,
                "Draw recall lines' lengths log-uniformly (as many short as long) instead of "
                "uniformly");
  in_range(cmd->add_option("--echoes", shape.echoes,
                           "Fraction of detective stories followed by a run of their own words "
                           "again")
               ->capture_default_str(),
           0, 1);
  cmd->add_flag("--signatures,!--no-signatures", shape.signatures,
                "Reference sentences first name the antecedent's signature (\"put on her scarf\"), "
                "which only its identity tells")
      ->capture_default_str();
}

void ModelOptions::add(CLI::App* m, bool full) {
  positive(m->add_option("--n-layer", model.n_layer, "Layers")->capture_default_str());
  if (full) {
    positive(m->add_option("--n-head", model.n_head, "Attention heads")->capture_default_str());
    at_least(m->add_option("--n-kv-head", n_kv_head, "Key/value heads (default: n-head)"), 0);
  }
  positive(m->add_option("--n-embd", model.n_embd, "Embedding width")->capture_default_str());
  positive(
      m->add_option("--block-size", model.block_size, "Context length")->capture_default_str());
  m->add_option("--positional", positional, "learned, sinusoidal, rope, alibi or none")
      ->capture_default_str();
  if (!full) return;
  m->add_option("--norm", norm, "layernorm or rmsnorm")->capture_default_str();
  positive(
      m->add_option("--mlp-ratio", model.mlp_ratio, "MLP width / n-embd")->capture_default_str());
  below_one(
      m->add_option("--dropout", model.dropout, "Dropout probability")->capture_default_str());
  m->add_flag("--post-norm", post_norm, "Post-norm blocks (original Transformer)");
  m->add_flag("--no-bias", no_bias, "No biases in linear layers and norms");
  m->add_flag("--encoder", encoder, "Bidirectional encoder trained on masked tokens");
  m->add_flag("--untied", untied, "A separate lm_head instead of the token embedding");
}

model::GPTConfig ModelOptions::config() const {
  model::GPTConfig c = model;
  c.positional = model::parse_positional(positional);
  c.norm = model::parse_norm(norm);
  c.norm_first = !post_norm;
  c.bias = !no_bias;
  c.causal = !encoder;
  c.tied_embeddings = !untied;
  c.n_kv_head = n_kv_head > 0 ? n_kv_head : c.n_head;
  return c;
}

model::Tokenizer make_tokenizer(const std::string& spec, std::string_view text) {
  if (spec == "byte") return model::Tokenizer::byte_level();
  if (spec.rfind("bpe:", 0) == 0) {
    const std::string vocab = spec.substr(4);
    int64_t n = 0;
    size_t used = 0;
    try {
      n = std::stoll(vocab, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used > 0 && used == vocab.size(),
          "--tokenizer: bpe:VOCAB needs a whole number of tokens, got \"{}\"", spec);
    return model::Tokenizer::train_bpe(text, n);
  }
  std::ifstream in(spec);
  check(in.good(), "--tokenizer: expected byte, bpe:VOCAB or a tokenizer JSON file, got \"{}\"",
        spec);
  std::stringstream buf;
  buf << in.rdbuf();
  return model::Tokenizer::from_json(buf.str());
}

}  // namespace headlight::cli

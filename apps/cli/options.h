// The options several subcommands share, and the checks every numeric option gets, in one place:
// a value out of range is refused by the parser with a message that names the option.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "headlight/model/config.h"
#include "headlight/model/tokenizer.h"
#include "headlight/train/corpus.h"

namespace headlight::cli {

// Numeric checks. Each returns `opt` so that it chains after add_option.
CLI::Option* at_least(CLI::Option* opt, double lo);             // ≥ lo
CLI::Option* positive(CLI::Option* opt);                        // > 0
CLI::Option* in_range(CLI::Option* opt, double lo, double hi);  // lo ≤ x ≤ hi
CLI::Option* below_one(CLI::Option* opt);  // 0 ≤ x < 1 (a probability to drop)

// --threads: 0 (all the hardware threads) up to this machine's hardware thread count; more is
// refused (results are the same for every thread count, so more threads than cores only slows).
CLI::Option* add_threads_option(CLI::App* cmd, int& threads, int default_threads = 0);

// --dtype f32|bf16: bf16 runs a model's dense products in bf16 (GPT::set_dtype). Worded for the
// commands that run a model (generate, eval, embed, heads, prune, explain, demo; importance's
// backward passes in mixed precision) or, with `training`, for those that train (train, sweep).
CLI::Option* add_dtype_option(CLI::App* cmd, std::string& dtype, bool training = false);

// --micro-batches: a training step's micro-batches (train::TrainOptions::micro_batches), shared by
// `train` and `sweep`.
CLI::Option* add_micro_batches_option(CLI::App* cmd, int64_t& micro_batches);

// --references, --drills, --drill-words, --drill-log-lengths, --echoes and --signatures: the
// detective corpus's shape, shared by `corpus detective`, `train` and `sweep`.
void add_corpus_shape_options(CLI::App* cmd, train::CorpusOptions& shape);

// The model options of `train` (and, without the head counts, of `sweep`).
struct ModelOptions {
  model::GPTConfig model;
  std::string positional = "learned", norm = "layernorm";
  bool post_norm = false, no_bias = false, encoder = false, untied = false;
  int64_t n_kv_head = 0;  // 0: n_head

  // Adds the options to `group`: with `full`, every option; without, the shape a head-count sweep
  // keeps (--n-layer, --n-embd, --block-size, --positional).
  void add(CLI::App* group, bool full = true);
  // The config the options describe (vocab_size is left to the caller).
  model::GPTConfig config() const;
};

// --tokenizer: "byte", "bpe:VOCAB" (learnt from `text`) or the path of a tokenizer JSON file.
model::Tokenizer make_tokenizer(const std::string& spec, std::string_view text);

}  // namespace headlight::cli

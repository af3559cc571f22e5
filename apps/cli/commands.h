// Each subcommand of the `headlight` tool registers itself on the app; the files hold parsing and
// printing only.
#pragma once

#include <CLI/CLI.hpp>

namespace headlight::cli {

void add_version(CLI::App& app);
void add_attention_demo(CLI::App& app);
void add_bench(CLI::App& app);
void add_corpus(CLI::App& app);
void add_tokenizer(CLI::App& app);
void add_train(CLI::App& app);
void add_eval(CLI::App& app);
void add_generate(CLI::App& app);
void add_heads(CLI::App& app);
void add_prune(CLI::App& app);
void add_sweep(CLI::App& app);
void add_demo(CLI::App& app);
void add_explain(CLI::App& app);
void add_info(CLI::App& app);
void add_embed(CLI::App& app);

}  // namespace headlight::cli

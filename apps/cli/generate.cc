// headlight generate: continues a prompt with a checkpoint, streaming the text as it is produced.

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "commands.h"
#include "headlight/core/error.h"
#include "headlight/model/sampling.h"
#include "headlight/train/checkpoint.h"
#include "options.h"

namespace headlight::cli {

void add_generate(CLI::App& app) {
  struct Args {
    std::string model;
    std::string prompt =
        "The red key for Maria lay in the kitchen. The blue map for John lay in the garden. Later "
        "she";
    int64_t tokens = 40;
    model::SamplingOptions sampling{.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    bool greedy = false;
    bool stats = false;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt (KV-cached decoding)");
  cmd->add_option("model", a->model, "Checkpoint (safetensors)")->required();
  cmd->add_option("--prompt", a->prompt, "Text to continue")->capture_default_str();
  at_least(cmd->add_option("--tokens", a->tokens, "New tokens")->capture_default_str(), 0);
  at_least(
      cmd->add_option("--temperature", a->sampling.temperature, "Sampling temperature (0: greedy)")
          ->capture_default_str(),
      0);
  at_least(cmd->add_option("--top-k", a->sampling.top_k, "Sample among the k most likely (0: all)")
               ->capture_default_str(),
           0);
  positive(in_range(cmd->add_option("--top-p", a->sampling.top_p, "Nucleus sampling threshold")
                        ->capture_default_str(),
                    0, 1));
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("--greedy", a->greedy, "Always the most likely token (temperature 0)");
  cmd->add_flag("--stats", a->stats, "Print the generation speed (tokens/s) to stderr");
  add_threads_option(cmd, a->threads);
  cmd->callback([a] {
    train::LoadedModel loaded = train::load_model(a->model);
    check(loaded.tokenizer.has_value(), "{}: the checkpoint has no tokenizer", a->model);
    if (a->greedy) a->sampling.temperature = 0.0f;
    model::validate(a->sampling);
    const auto prompt = loaded.tokenizer->encode(a->prompt);
    check(!prompt.empty(), "--prompt: empty");
    ThreadContext ctx(a->threads);
    fmt::print("{}", a->prompt);
    std::fflush(stdout);
    const auto& tok = *loaded.tokenizer;
    const auto start = std::chrono::steady_clock::now();
    const auto out =
        model::generate(ctx, loaded.model, prompt, a->tokens, a->sampling, [&](int32_t id) {
          fmt::print("{}", tok.token_bytes(id));
          std::fflush(stdout);
        });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("\n");
    if (a->stats)
      fmt::print(stderr, "{} prompt tokens, {} new tokens in {:.3f} s: {:.0f} tokens/s\n",
                 prompt.size(), out.size(), seconds, static_cast<double>(out.size()) / seconds);
  });
}

}  // namespace headlight::cli

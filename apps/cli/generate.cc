// headlight generate: continues a prompt (or answers it as a chat, in the model's template) with
// any model the loaders read, streaming the text as it is produced.

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "commands.h"
#include "headlight/core/error.h"
#include "headlight/load/chat.h"
#include "headlight/load/model.h"
#include "headlight/model/sampling.h"
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
    std::string dtype = "f32";
    bool chat = false;
    std::string system;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt (KV-cached decoding)");
  cmd->add_option("model", a->model, "Checkpoint, Hugging Face folder or .gguf file")->required();
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
  cmd->add_flag("--chat", a->chat,
                "The prompt as a user message in the model's chat template; the reply is printed");
  cmd->add_option("--system", a->system, "A system message (with --chat)");
  cmd->add_flag("--stats", a->stats, "Print the generation speed (tokens/s) to stderr");
  add_dtype_option(cmd, a->dtype);
  add_threads_option(cmd, a->threads);
  cmd->callback([a] {
    check(a->chat || a->system.empty(), "--system: needs --chat");
    load::Model m = load::load_model(a->model);
    m.net.set_dtype(parse_dtype(a->dtype, "--dtype"));
    check(m.tokenizer.has_value(), "{}: the model has no tokenizer{}{}", a->model,
          m.tokenizer_error.empty() ? "" : ": ", m.tokenizer_error);
    check(m.net.config().lm_head, "{}: an encoder has no LM head to generate with", a->model);
    if (a->greedy) a->sampling.temperature = 0.0f;
    a->sampling.stop_tokens = m.eos_ids;
    model::validate(a->sampling);
    const model::TextTokenizer& tok = *m.tokenizer;
    std::vector<int32_t> prompt;
    if (a->chat) {
      std::vector<load::ChatMessage> messages;
      if (!a->system.empty()) messages.push_back({"system", a->system});
      messages.push_back({"user", a->prompt});
      prompt = load::chat_prompt(m, messages, /*add_generation_prompt=*/true);
    } else {
      prompt = tok.encode(a->prompt);
      fmt::print("{}", a->prompt);
    }
    check(!prompt.empty(), "--prompt: empty");
    ThreadContext ctx(a->threads);
    std::fflush(stdout);
    // Each step decodes everything produced so far and prints what is new, holding back a tail
    // that is not yet whole UTF-8 (a character split across byte-level tokens).
    std::vector<int32_t> produced;
    size_t printed = 0;
    const auto start = std::chrono::steady_clock::now();
    const auto out = model::generate(ctx, m.net, prompt, a->tokens, a->sampling, [&](int32_t id) {
      produced.push_back(id);
      const std::string text = tok.decode(produced);
      if (text.size() > printed && !text.ends_with("\xEF\xBF\xBD")) {
        fmt::print("{}", text.substr(printed));
        printed = text.size();
        std::fflush(stdout);
      }
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string text = tok.decode(produced);
    if (text.size() > printed) fmt::print("{}", text.substr(printed));
    fmt::print("\n");
    std::fflush(stdout);
    if (a->stats)
      fmt::print(stderr, "{} prompt tokens, {} new tokens in {:.3f} s: {:.0f} tokens/s\n",
                 prompt.size(), out.size(), seconds, static_cast<double>(out.size()) / seconds);
  });
}

}  // namespace headlight::cli

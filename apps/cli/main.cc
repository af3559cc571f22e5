// headlight: the command-line tool. `headlight --help` lists the subcommands.

#include <cstdio>
#include <exception>

#include "commands.h"
#include "headlight/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"headlight: multi-head attention that is fast and inspectable"};
  app.require_subcommand(1);
  headlight::cli::add_version(app);
  headlight::cli::add_attention_demo(app);
  headlight::cli::add_bench(app);
  headlight::cli::add_corpus(app);
  headlight::cli::add_tokenizer(app);
  headlight::cli::add_train(app);
  headlight::cli::add_eval(app);
  headlight::cli::add_generate(app);
  headlight::cli::add_info(app);
  headlight::cli::add_embed(app);
  headlight::cli::add_heads(app);
  headlight::cli::add_prune(app);
  headlight::cli::add_sweep(app);
  headlight::cli::add_demo(app);
  headlight::cli::add_explain(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const headlight::Error& e) {
    std::fprintf(stderr, "headlight: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc& e) {  // headlight::OutOfMemory names what was being allocated
    std::fprintf(stderr, "headlight: error: out of memory: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "headlight: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}

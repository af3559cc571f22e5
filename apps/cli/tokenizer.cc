// headlight tokenizer train: learns a byte-level BPE from a corpus and writes it as JSON.

#include <fmt/format.h>

#include "commands.h"
#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "headlight/model/tokenizer.h"
#include "headlight/train/corpus.h"
#include "options.h"

namespace headlight::cli {

void add_tokenizer(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenizer", "Tokenizers");
  cmd->require_subcommand(1);
  struct Args {
    std::string corpus = "detective";
    int64_t vocab = 1024;
    int64_t stories = 5000;
    uint64_t seed = 1;
    std::string out = "tokenizer.json";
  };
  auto args = std::make_shared<Args>();
  auto* train = cmd->add_subcommand("train", "Learn a byte-level BPE tokenizer from a corpus");
  train->add_option("--corpus", args->corpus, "\"detective\" or a text file")
      ->capture_default_str();
  at_least(
      train->add_option("--vocab", args->vocab, "Vocabulary size (≥ 256)")->capture_default_str(),
      256);
  positive(train->add_option("--stories", args->stories, "Stories of the detective corpus")
               ->capture_default_str());
  train->add_option("--seed", args->seed, "Corpus seed")->capture_default_str();
  train->add_option("--out", args->out, "Where to write the tokenizer (JSON)")
      ->capture_default_str();
  train->callback([args] {
    const auto text = train::load_text(args->corpus, args->stories, 1, {.seed = args->seed});
    const auto tok = model::Tokenizer::train_bpe(text.train, args->vocab);
    AtomicFile out(args->out);
    out.write(tok.to_json() + "\n");
    out.commit();
    const auto ids = tok.encode(text.train);
    fmt::print(
        "tokenizer: {} tokens ({} merges) written to {}; the corpus is {} bytes → {} tokens "
        "({:.2f} bytes per token)\n",
        tok.vocab_size(), tok.vocab_size() - 256, args->out, text.train.size(), ids.size(),
        static_cast<double>(text.train.size()) / static_cast<double>(ids.size()));
  });
}

}  // namespace headlight::cli

// headlight train: trains a GPT on a corpus and writes the checkpoint; headlight eval: the loss and
// perplexity of a checkpoint on a corpus's validation text.

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/core/error.h"
#include "headlight/load/model.h"
#include "headlight/train/checkpoint.h"
#include "headlight/train/corpus.h"
#include "headlight/train/trainer.h"
#include "options.h"

namespace headlight::cli {

namespace {

struct TrainArgs {
  ModelOptions model;
  train::TrainOptions train;
  float lr = 2e-3f, min_lr = 2e-4f;
  int64_t warmup = 100;
  std::string corpus = "detective";
  int64_t stories = 20000, val_stories = 500;
  train::CorpusOptions shape;  // seed, references and recall lines of the detective corpus
  std::string tokenizer = "byte";
  int threads = 0;
  bool json = false;
  std::string out = "model.safetensors";
  std::string init;                 // a checkpoint whose weights and tokenizer the run starts from
  std::string dtype = "f32";        // of the dense products (bf16: mixed precision)
  CLI::App* model_group = nullptr;  // the model options, refused with --resume/--init
  CLI::Option* tokenizer_option = nullptr;  // likewise
};

std::string duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// A progress bar on a terminal, plain lines otherwise.
void report(const train::StepReport& r, int64_t log_every, bool tty) {
  if (tty) {
    const int width = 30;
    const int done = static_cast<int>(width * r.step / std::max<int64_t>(1, r.steps));
    fmt::print(stderr, "\r[{}{}] step {}/{}  loss {:.4f}  {:.0f} tok/s  ETA {}   ",
               std::string(static_cast<size_t>(done), '#'),
               std::string(static_cast<size_t>(width - done), '.'), r.step, r.steps, r.loss,
               r.tokens_per_second, duration(r.eta));
    if (r.val_loss)
      fmt::print(stderr, "\nstep {}: val loss {:.4f} (perplexity {:.2f})\n", r.step, *r.val_loss,
                 std::exp(*r.val_loss));
    std::fflush(stderr);
    return;
  }
  if (r.step % log_every == 0 || r.val_loss) {
    fmt::print(stderr,
               "step {}/{}  loss {:.4f}  lr {:.2e}  grad norm {:.3f}  {:.0f} tok/s  ETA {}{}\n",
               r.step, r.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_second, duration(r.eta),
               r.val_loss ? fmt::format("  val loss {:.4f}", *r.val_loss) : "");
  }
}

void add_train_options(CLI::App* cmd, TrainArgs& a) {
  cmd->add_option("--corpus", a.corpus, "\"detective\" or a text file (last tenth: validation)")
      ->capture_default_str();
  cmd->add_option("--out", a.out, "Checkpoint to write (safetensors)")->capture_default_str();
  a.tokenizer_option = cmd->add_option("--tokenizer", a.tokenizer,
                                       "byte, bpe:VOCAB (learnt from the corpus) or a JSON file")
                           ->capture_default_str();
  positive(cmd->add_option("--stories", a.stories, "Training stories (detective corpus)")
               ->capture_default_str());
  positive(
      cmd->add_option("--val-stories", a.val_stories, "Validation stories")->capture_default_str());
  add_corpus_shape_options(cmd, a.shape);
  cmd->add_option("--corpus-seed", a.shape.seed, "Seed of the detective corpus")
      ->capture_default_str();
  a.model_group = cmd->add_option_group("model");
  a.model.add(a.model_group);
  auto* t = cmd->add_option_group("training");
  positive(t->add_option("--steps", a.train.steps, "Optimizer steps")->capture_default_str());
  positive(t->add_option("--batch", a.train.batch, "Sequences per step")->capture_default_str());
  add_micro_batches_option(t, a.train.micro_batches);
  at_least(t->add_option("--seq", a.train.seq, "Tokens per sequence (0: block size)")
               ->capture_default_str(),
           0);
  positive(t->add_option("--lr", a.lr, "Peak learning rate")->capture_default_str());
  at_least(t->add_option("--min-lr", a.min_lr, "Final learning rate")->capture_default_str(), 0);
  at_least(t->add_option("--warmup", a.warmup, "Warmup steps")->capture_default_str(), 0);
  at_least(t->add_option("--weight-decay", a.train.adam.weight_decay, "AdamW weight decay")
               ->capture_default_str(),
           0);
  at_least(t->add_option("--grad-clip", a.train.grad_clip, "Gradient norm clip (0: off)")
               ->capture_default_str(),
           0);
  positive(t->add_option("--eval-every", a.train.eval_every, "Steps between evaluations")
               ->capture_default_str());
  positive(t->add_option("--eval-batches", a.train.eval_batches, "Batches per evaluation")
               ->capture_default_str());
  at_least(t->add_option("--checkpoint-every", a.train.checkpoint_every,
                         "Steps between checkpoints (0: at evaluations)")
               ->capture_default_str(),
           0);
  t->add_option("--seed", a.train.seed, "Seed of the weights, batches and dropout")
      ->capture_default_str();
  t->add_option("--metrics", a.train.metrics, "JSONL metrics log");
  positive(t->add_option("--log-every", a.train.log_every,
                         "Steps between progress lines and metrics log lines")
               ->capture_default_str());
  add_dtype_option(t, a.dtype, /*training=*/true);
  t->add_flag("--resume", a.train.resume, "Continue from --out and its optimizer state");
  t->add_option("--init", a.init,
                "Start from this checkpoint's weights and tokenizer (fine-tuning: a new optimizer "
                "and schedule; the model options are the checkpoint's)")
      ->excludes("--resume");
  add_threads_option(cmd, a.threads);
  cmd->add_flag("--json", a.json, "Print the result as JSON");
}

// A run that starts from a checkpoint takes its model and tokenizer: options that would describe
// another one are an error rather than silently ignored.
void check_checkpoint_options(const TrainArgs& a) {
  if (!a.train.resume && a.init.empty()) return;
  std::vector<CLI::Option*> given = a.model_group->get_options();
  given.push_back(a.tokenizer_option);
  for (const CLI::Option* opt : given)
    check(opt->count() == 0, "{}: the model and tokenizer come from the checkpoint ({}); drop {}",
          a.train.resume ? "--resume" : "--init", a.train.resume ? a.out : a.init, opt->get_name());
}

void print_result(const train::TrainResult& r, const TrainArgs& a) {
  const nlohmann::json j = {{"steps", r.steps},       {"train_loss", r.train_loss},
                            {"val_loss", r.val_loss}, {"val_perplexity", std::exp(r.val_loss)},
                            {"seconds", r.seconds},   {"tokens_per_second", r.tokens_per_second},
                            {"checkpoint", a.out}};
  if (a.json) {
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(
        "trained {} steps in {}: train loss {:.4f}, validation loss {:.4f} (perplexity "
        "{:.2f}), {:.0f} tokens/s; wrote {}\n",
        r.steps, duration(r.seconds), r.train_loss, r.val_loss, std::exp(r.val_loss),
        r.tokens_per_second, a.out);
  }
}

void run_train(const TrainArgs& a) {
  check_checkpoint_options(a);
  model::GPTConfig c = a.model.config();
  const train::TextSplits text = train::load_text(a.corpus, a.stories, a.val_stories, a.shape);
  ThreadContext ctx(a.threads);
  train::TrainOptions o = a.train;
  o.out = a.out;
  o.schedule = {.lr = a.lr, .min_lr = a.min_lr, .warmup = a.warmup, .total = o.steps};
  std::optional<model::GPT> gpt;
  std::optional<model::Tokenizer> tok;
  if (o.resume || !a.init.empty()) {
    train::LoadedModel loaded = train::load_model(o.resume ? a.out : a.init);
    gpt.emplace(std::move(loaded.model));
    tok = std::move(loaded.tokenizer);
  } else {
    tok = make_tokenizer(a.tokenizer, text.train);
    // Encoders need one id the tokenizer never produces: the mask token.
    c.vocab_size = tok->vocab_size() + (c.causal ? 0 : 1);
    gpt.emplace(c, o.seed);
  }
  gpt->set_dtype(parse_dtype(a.dtype, "--dtype"));
  const std::vector<int32_t> train_ids = tok->encode(text.train),
                             val_ids = tok->encode(text.validation);
  fmt::print(stderr,
             "training a {}-layer, {}-head, n_embd {} model ({} parameters) on {} tokens "
             "({} validation) with {} threads\n",
             gpt->config().n_layer, gpt->config().n_head, gpt->config().n_embd,
             gpt->layout().total(), train_ids.size(), val_ids.size(), ctx.num_threads());
  const bool tty = ::isatty(::fileno(stderr)) != 0;
  const train::TrainResult r =
      train::train_model(ctx, *gpt, tok ? &*tok : nullptr, train_ids, val_ids, o,
                         [&](const train::StepReport& s) { report(s, o.log_every, tty); });
  if (tty) fmt::print(stderr, "\n");
  print_result(r, a);
}

}  // namespace

void add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a GPT-style model on a corpus");
  add_train_options(cmd, *a);
  cmd->callback([a] { run_train(*a); });
}

void add_eval(CLI::App& app) {
  struct Args {
    std::string model, corpus = "detective";
    int64_t stories = 500, batch = 16, batches = 1000000, seq = 1024;
    uint64_t seed = 1;
    std::string split = "validation", dtype = "f32";
    int threads = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("eval", "Loss and perplexity of a model on a corpus");
  cmd->add_option("model", a->model, "Checkpoint, Hugging Face folder or .gguf file")->required();
  cmd->add_option("--corpus", a->corpus, "\"detective\" or a text file (its last tenth is used)")
      ->capture_default_str();
  cmd->add_option("--split", a->split, "Detective split: validation or test")
      ->capture_default_str();
  positive(cmd->add_option("--stories", a->stories, "Detective stories")->capture_default_str());
  cmd->add_option("--corpus-seed", a->seed, "Seed of the detective corpus")->capture_default_str();
  positive(cmd->add_option("--batch", a->batch, "Sequences per batch")->capture_default_str());
  positive(cmd->add_option("--max-batches", a->batches, "Most batches to evaluate"));
  positive(cmd->add_option("--seq", a->seq, "Tokens per sequence (at most the model's context)")
               ->capture_default_str());
  add_threads_option(cmd, a->threads);
  add_dtype_option(cmd, a->dtype);
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    load::Model loaded = load::load_model(a->model);
    loaded.net.set_dtype(parse_dtype(a->dtype, "--dtype"));
    check(loaded.tokenizer.has_value(), "{}: the model has no tokenizer to encode text with{}{}",
          a->model, loaded.tokenizer_error.empty() ? "" : ": ", loaded.tokenizer_error);
    check(loaded.net.config().lm_head, "{}: an encoder has no LM head to score text with",
          a->model);
    std::string text;
    if (a->corpus == "detective") {
      text = train::corpus_text(
          train::detective_stories({train::parse_split(a->split), a->stories, a->seed}));
    } else {
      text = train::load_text(a->corpus, 0, 0, {.seed = a->seed}).validation;
    }
    const auto ids = loaded.tokenizer->encode(text, /*add_special_tokens=*/false);
    ThreadContext ctx(a->threads);
    const int64_t seq = std::min<int64_t>(loaded.net.config().block_size, a->seq);
    const double loss = train::evaluate(ctx, loaded.net, ids, a->batch, seq, a->batches);
    if (a->json) {
      fmt::print(
          "{}\n",
          nlohmann::json{{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", ids.size()}}
              .dump());
    } else {
      fmt::print("{}: loss {:.4f}, perplexity {:.3f} over {} tokens\n", a->model, loss,
                 std::exp(loss), ids.size());
    }
  });
}

}  // namespace headlight::cli

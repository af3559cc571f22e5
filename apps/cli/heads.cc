// headlight heads / prune / sweep: printing and parsing around inspect/analysis.h. `heads` and
// `prune --curve` take any model the loaders read (load/model.h); `prune --out` writes headlight
// checkpoints of headlight models.

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/core/error.h"
#include "headlight/inspect/analysis.h"
#include "headlight/inspect/coreference.h"
#include "headlight/load/model.h"
#include "headlight/train/checkpoint.h"
#include "options.h"

namespace headlight::cli {

namespace {

struct DataArgs {
  inspect::DataOptions data;
  int threads = 0;
  bool json = false;
  std::string dtype = "f32";
  // The model and the data importance is scored on and pruning judged by.
  struct Loaded {
    load::Model model;
    inspect::Datasets data{};
    const model::TextTokenizer* tokenizer() const {
      return model.tokenizer ? &*model.tokenizer : nullptr;
    }
  };
  Loaded load(ThreadContext& ctx, const std::string& path) const {
    Loaded out{.model = load::load_model(path)};
    out.model.net.set_dtype(parse_dtype(dtype, "--dtype"));
    const model::GPTConfig& c = out.model.net.config();
    check(data.seq <= c.block_size, "--seq: {} is longer than the model's context {}", data.seq,
          c.block_size);
    out.data = inspect::corpus_datasets(ctx, out.model, data);
    return out;
  }
  void add(CLI::App* cmd) {
    cmd->add_option("--corpus", data.corpus,
                    "\"detective\" (its validation stories) or a text file (importance scored on "
                    "its first half of lines, pruning judged on the second)")
        ->capture_default_str();
    positive(cmd->add_option("--sequences", data.sequences,
                             "Evaluation sequences of each part (an embedding model: 4× as many "
                             "sentences)")
                 ->capture_default_str());
    positive(cmd->add_option("--seq", data.seq,
                             "Tokens per evaluation sequence (default: the model's context, at "
                             "most 256)"));
    add_threads_option(cmd, threads);
    add_dtype_option(cmd, dtype);
    cmd->add_flag("--json", json, "Print JSON");
    cmd->add_flag("--signatures", data.signatures,
                  "Detective stories with signatures (for a model trained with them): evaluation "
                  "text, and coreference by name scored from the possessive before the signature");
  }
};

// A score with `decimals`, or "n/a" when it was not measured (NaN).
std::string score(double v, int decimals) {
  return std::isnan(v) ? "n/a" : fmt::format("{:.{}f}", v, decimals);
}

// The table, a "kv" column (the key/value head each query head shares) for grouped-query models,
// and last the scores of a head that attends uniformly: the baseline of each.
void print_table(const std::vector<inspect::HeadRow>& rows, const inspect::RoleScores& uniform,
                 bool grouped) {
  fmt::print(
      "{:>5} {:>4}{}  {:<15} {:>10} {:>9}  {:>8} {:>9} {:>6} {:>6} {:>6} {:>9} {:>11}  {:>9}\n",
      "layer", "head", grouped ? "   kv" : "", "role", "importance", "ablation", "prev_tok",
      "prev_text", "first", "local", "self", "induction", "coreference", "coref_sent");
  auto scores = [](const inspect::RoleScores& s) {
    return fmt::format(
        "{:>8.3f} {:>9.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>9.3f} {:>5.3f} ({:>3.0f}%) {:>5.3f} "
        "({:>3.0f}%)",
        s.previous_token, s.previous_token_text, s.first_token, s.local, s.self, s.induction,
        s.coreference, 100 * s.coreference_accuracy, s.coreference_sentence,
        100 * s.coreference_sentence_accuracy);
  };
  for (const auto& r : rows)
    fmt::print("{:>5} {:>4}{}  {:<15} {:>10} {:>9}  {}\n", r.layer, r.head,
               grouped ? fmt::format(" {:>4}", r.kv_head) : "", r.role, score(r.importance, 3),
               score(r.ablation, 4), scores(r.scores));
  fmt::print("{:>10}{}  {:<15} {:>10} {:>9}  {}\n", "uniform", grouped ? "     " : "", "(baseline)",
             "", "", scores(uniform));
}

// The natural-coreference summary: the rule's accuracy and the best heads.
void print_coreference(const inspect::CorefResult& r, int64_t n_layer, int64_t n_head,
                       const std::string& file) {
  std::vector<std::pair<double, int64_t>> best;
  for (int64_t i = 0; i < n_layer * n_head; ++i)
    best.emplace_back(r.accuracy[static_cast<size_t>(i)], i);
  std::stable_sort(best.begin(), best.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  std::string heads;
  for (size_t k = 0; k < std::min<size_t>(5, best.size()); ++k)
    heads += fmt::format("{}layer {} head {} ({:.0f}%)", k ? ", " : "", best[k].second / n_head,
                         best[k].second % n_head, 100 * best[k].first);
  fmt::print(
      "\nnatural coreference over {} passages of {}: the rule \"nearest name\" is right for "
      "{:.0f}%; best heads: {}\n",
      r.passages, file, 100 * r.nearest_name_accuracy, heads);
}

}  // namespace

void add_heads(CLI::App& app) {
  struct Args : DataArgs {
    std::string model;
    std::string text;
    std::string coreference;  // passages in data/coreference.json's form
    bool no_ablation = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("heads", "Every head's role scores, role and importance");
  cmd->add_option("model", a->model, "Checkpoint, Hugging Face folder or .gguf file")->required();
  cmd->add_option("--text", a->text, "Text for the text-based scores (default: test stories)");
  cmd->add_option("--coreference", a->coreference,
                  "Also score coreference on natural passages (e.g. data/coreference.json)");
  cmd->add_flag("--no-ablation", a->no_ablation,
                "Skip ablation importance (one evaluation per head: slow on large models)");
  a->add(cmd);
  cmd->callback([a] {
    std::vector<inspect::CorefPassage> passages;  // read first: a bad file fails at once
    if (!a->coreference.empty()) passages = inspect::read_coreference_passages(a->coreference);
    ThreadContext ctx(a->threads);
    auto l = a->load(ctx, a->model);
    inspect::RoleOptions o;
    o.text = a->text;
    o.signatures = a->data.signatures;
    o.ablation = !a->no_ablation;
    inspect::RoleScores uniform;
    const auto rows =
        inspect::head_table(ctx, l.model.net, l.tokenizer(), l.data.score, o, &uniform);
    std::optional<inspect::CorefResult> coref;
    if (!passages.empty()) {
      check(l.tokenizer() != nullptr, "--coreference: the model has no tokenizer");
      coref = inspect::natural_coreference(ctx, l.model.net, *l.tokenizer(), passages);
    }
    const auto& c = l.model.net.config();
    if (a->json) {
      fmt::print("{{\"heads\":{},\"uniform\":{}{}}}\n", inspect::head_table_json(rows),
                 inspect::scores_json(uniform),
                 coref
                     ? ",\"coreference\":" + inspect::coreference_json(*coref, c.n_layer, c.n_head)
                     : "");
      return;
    }
    print_table(rows, uniform, c.n_kv_head != c.n_head);
    if (coref) print_coreference(*coref, c.n_layer, c.n_head, a->coreference);
  });
}

void add_prune(CLI::App& app) {
  struct Args : DataArgs {
    std::string model, out, by = "importance";
    double fraction = 0.3;
    uint64_t seed = 0;
    bool curve = false;
    std::vector<double> fractions;
    std::vector<std::string> methods;
    int64_t random_seeds = 5;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("prune", "Remove heads physically and measure the effect");
  cmd->add_option("model", a->model, "Checkpoint, Hugging Face folder or .gguf file")->required();
  in_range(cmd->add_option("--fraction", a->fraction, "Fraction of the heads to remove")
               ->capture_default_str(),
           0, 1);
  cmd->add_option("--by", a->by, "importance, ablation or random")->capture_default_str();
  cmd->add_option("--out", a->out,
                  "Where to write the smaller model (a headlight checkpoint that keeps a real "
                  "model's tokenizer, pooling and chat template)");
  cmd->add_option("--seed", a->seed, "Seed of the random choice")->capture_default_str();
  cmd->add_flag("--curve", a->curve,
                "The judging measure against the fraction removed for each method instead");
  in_range(
      cmd->add_option("--fractions", a->fractions, "--curve: the fractions (default 0.1,0.2,…,0.9)")
          ->delimiter(','),
      0, 1);
  cmd->add_option("--methods", a->methods,
                  "--curve: importance, ablation and/or random (default all three)")
      ->delimiter(',');
  positive(cmd->add_option("--random-seeds", a->random_seeds,
                           "--curve: random choices averaged per fraction")
               ->capture_default_str());
  a->add(cmd);
  cmd->callback([a] {
    inspect::CurveOptions co;
    if (!a->fractions.empty()) co.fractions = a->fractions;
    if (!a->methods.empty()) {
      co.methods.clear();
      for (const std::string& m : a->methods) co.methods.push_back(inspect::parse_prune_by(m));
    }
    co.random_seeds = a->random_seeds;
    check(a->curve || !a->out.empty(), "--out: the path of the smaller model is required");
    ThreadContext ctx(a->threads);
    auto l = a->load(ctx, a->model);
    model::GPT& net = l.model.net;
    const inspect::Dataset& score = l.data.score;
    const inspect::Dataset& judge = l.data.held_out;
    check(inspect::measurable(net.config(), judge),
          "{}: pruning is judged by the LM loss or by sentence embeddings, and this encoder has "
          "neither an LM head nor pooling",
          a->model);
    if (a->curve) {
      const auto points = inspect::pruning_curve(ctx, net, score, judge, co);
      const double full = inspect::dataset_loss(ctx, net, judge);
      if (a->json) {
        fmt::print("{{\"measure\":\"{}\",\"full\":{},\"curve\":{}}}\n", judge.measure(), full,
                   inspect::curve_json(points));
        return;
      }
      fmt::print("held-out {} by fraction of heads removed (the full model: {:.4f})\n{:>8}",
                 judge.measure(), full, "fraction");
      for (auto by : co.methods) fmt::print(" {:>11}", inspect::prune_by_name(by));
      fmt::print("\n");
      for (size_t i = 0; i < points.size(); i += co.methods.size()) {
        fmt::print("{:>8.2f}", points[i].fraction);
        for (size_t k = 0; k < co.methods.size(); ++k) fmt::print(" {:>11.4f}", points[i + k].loss);
        fmt::print("\n");
      }
      return;
    }
    const auto r = inspect::prune_model(ctx, net, score, judge, a->fraction,
                                        inspect::parse_prune_by(a->by), a->seed);
    load::write_model(l.model, *r.pruned, a->out);
    if (a->json) {
      auto removed = nlohmann::json::array();
      for (const auto& [l, h] : r.heads_removed) removed.push_back({l, h});
      fmt::print("{}\n", nlohmann::json{{"measure", judge.measure()},
                                        {"loss_before", r.loss_before},
                                        {"loss_after", r.loss_after},
                                        {"seconds_before", r.seconds_before},
                                        {"seconds_after", r.seconds_after},
                                        {"heads_removed", removed}}
                             .dump());
      return;
    }
    fmt::print(
        "removed {} of {} heads by {}: held-out {} {:.4f} → {:.4f}; forward {:.4f} s → {:.4f} s "
        "({:.2f}× faster); wrote {}\n",
        r.heads_removed.size(), net.config().total_heads(), a->by, judge.measure(), r.loss_before,
        r.loss_after, r.seconds_before, r.seconds_after, r.seconds_before / r.seconds_after,
        a->out);
  });
}

void add_sweep(CLI::App& app) {
  struct Args {
    ModelOptions model;
    inspect::SweepOptions sweep;
    std::string tokenizer = "byte", dtype = "f32";
    int threads = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  a->sweep.train.steps = 300;
  a->sweep.train.eval_every = 300;
  a->sweep.train.schedule = {.lr = 2e-3f, .min_lr = 2e-4f, .warmup = 30, .total = 300};
  auto* cmd = app.add_subcommand("sweep", "Train one model per head count at equal n_embd");
  positive(cmd->add_option("--heads", a->sweep.heads, "Head counts")
               ->delimiter(',')
               ->capture_default_str());
  a->model.add(cmd, false);
  positive(cmd->add_option("--steps", a->sweep.train.steps, "Training steps per model")
               ->capture_default_str());
  positive(cmd->add_option("--batch", a->sweep.train.batch, "Sequences per step")
               ->capture_default_str());
  add_micro_batches_option(cmd, a->sweep.train.micro_batches);
  positive(cmd->add_option("--lr", a->sweep.train.schedule.lr, "Peak learning rate")
               ->capture_default_str());
  cmd->add_option("--corpus", a->sweep.corpus, "\"detective\" or a text file")
      ->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "byte, bpe:VOCAB (learnt from the corpus) or a JSON file")
      ->capture_default_str();
  positive(
      cmd->add_option("--stories", a->sweep.stories, "Training stories")->capture_default_str());
  add_corpus_shape_options(cmd, a->sweep.shape);
  cmd->add_option("--seed", a->sweep.train.seed, "Seed")->capture_default_str();
  add_threads_option(cmd, a->threads);
  add_dtype_option(cmd, a->dtype, /*training=*/true);
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    ThreadContext ctx(a->threads);
    const model::GPTConfig base = a->model.config();
    const train::TextSplits text =
        train::load_text(a->sweep.corpus, a->sweep.stories, 1, a->sweep.shape);
    const model::Tokenizer tok = make_tokenizer(a->tokenizer, text.train);
    inspect::SweepOptions o = a->sweep;
    o.dtype = parse_dtype(a->dtype, "--dtype");
    o.train.schedule.total = o.train.steps;
    o.train.eval_every = o.train.steps;
    const auto rows = inspect::head_sweep(ctx, base, tok, o);
    if (a->json) {
      fmt::print("{{\"sweep\":{}}}\n", inspect::sweep_json(rows));
      return;
    }
    fmt::print(
        "| heads | head dim | val loss | tokens/s | best previous-token | best induction | "
        "best coreference |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& r : rows)
      fmt::print("| {} | {} | {:.4f} | {:.0f} | {:.3f} | {:.3f} | {:.3f} |\n", r.heads,
                 base.n_embd / r.heads, r.val_loss, r.tokens_per_second, r.best.previous_token,
                 r.best.induction, r.best.coreference);
  });
}

}  // namespace headlight::cli

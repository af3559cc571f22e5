// headlight demo / explain: the head analysis of a model on a text, as a printed summary and an
// HTML report. `demo` uses the bundled model (models/detective.safetensors) and a detective story;
// `--retrain` trains that model from scratch first with the recipe of models/README.md.

#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "commands.h"
#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "headlight/inspect/explain.h"
#include "headlight/load/model.h"
#include "headlight/train/checkpoint.h"
#include "headlight/train/corpus.h"
#include "headlight/train/trainer.h"
#include "headlight/viz/report.h"
#include "options.h"

namespace headlight::cli {

namespace {

constexpr const char* kStory =
    "The red key for Maria lay in the kitchen. The blue map for John lay in the garden. Later she "
    "put on her";

struct ExplainArgs {
  std::string report = "demo/report.html";
  std::string png;
  std::string capture_json;          // the capture as JSON
  std::string npy;                   // the probabilities [n_layer, n_head, T, T] as .npy
  std::string corpus = "detective";  // or a text file (first half scores, second half judges)
  int64_t sequences = 32;
  int64_t seq = 0;  // tokens per evaluation sequence (0: the context, at most 256)
  int threads = 0;
  std::string dtype = "f32";  // of the model's products (GPT::set_dtype)
  bool no_curve = false;
  bool signatures = false;  // the model was trained on stories with signatures
  std::string coreference;  // natural passages to score every head on (data/coreference.json)
  bool no_ablation = false;
};

// The analysis options of the command-line arguments (the passages read first: a bad file fails
// before any work).
inspect::ExplainOptions explain_options(const ExplainArgs& a) {
  inspect::ExplainOptions o;
  o.data = {.corpus = a.corpus, .sequences = a.sequences, .seq = a.seq, .signatures = a.signatures};
  o.curve = !a.no_curve;
  o.ablation = !a.no_ablation;
  if (!a.coreference.empty()) o.coreference = inspect::read_coreference_passages(a.coreference);
  return o;
}

// Each output file, opened before the analysis so that a path that cannot be written fails at once
// (and nothing is left half-written if a later step fails).
struct ExplainOutputs {
  AtomicFile report;
  std::optional<AtomicFile> capture_json, npy, png;
  explicit ExplainOutputs(const ExplainArgs& a) : report(with_folder(a.report)) {
    if (!a.capture_json.empty()) capture_json.emplace(a.capture_json);
    if (!a.npy.empty()) npy.emplace(a.npy);
    if (!a.png.empty()) png.emplace(a.png);
  }
  // The report's folder is made when missing (demo/ in a fresh clone).
  static std::string with_folder(const std::string& path) {
    const std::filesystem::path p(path);
    if (p.has_parent_path() && !std::filesystem::is_directory(p.parent_path()))
      std::filesystem::create_directories(p.parent_path());
    return path;
  }
};

viz::ReportInput report_input(const std::string& model_path, const model::GPTConfig& c,
                              const inspect::Explanation& e, const std::string& attention) {
  viz::ReportInput in;
  in.title = "headlight: what each head does";
  in.model_summary = fmt::format("{}: {} layers × {} heads, n_embd {}, {} positions, {} tokens",
                                 model_path, c.n_layer, c.n_head, c.n_embd,
                                 model::positional_name(c.positional), c.vocab_size);
  in.continuation = e.continuation;
  in.summary = e.summary;
  in.attention = attention;
  in.heads = inspect::head_table_json(e.heads);
  in.curve = inspect::curve_json(e.curve);
  in.curve_measure = e.curve_measure;
  in.focus = e.focus;
  return in;
}

void run_explain(load::Model& loaded, const std::string& model_path, const std::string& text,
                 const ExplainArgs& a, const inspect::ExplainOptions& o) {
  check(loaded.tokenizer.has_value(), "{}: the model has no tokenizer to read text with{}{}",
        model_path, loaded.tokenizer_error.empty() ? "" : ": ", loaded.tokenizer_error);
  ExplainOutputs out(a);
  loaded.net.set_dtype(parse_dtype(a.dtype, "--dtype"));
  ThreadContext ctx(a.threads);
  const inspect::Explanation e = inspect::explain(ctx, loaded, text, o);
  fmt::print("{}{}\n\n", text, e.continuation);
  for (const std::string& line : e.summary) fmt::print("• {}\n", line);
  const std::string attention = inspect::to_json(e.capture);
  viz::write_report(out.report, report_input(model_path, loaded.net.config(), e, attention));
  fmt::print("\nwrote {}\n", a.report);
  if (out.capture_json) {
    out.capture_json->write(attention + "\n");
    out.capture_json->commit();
    fmt::print("wrote {}\n", a.capture_json);
  }
  if (out.npy) {
    inspect::write_npy(*out.npy, e.capture.probs.data(),
                       {e.capture.n_layer, e.capture.n_head, e.capture.seq, e.capture.seq});
    fmt::print("wrote {}\n", a.npy);
  }
  // The heatmap of the head the report opens with (Explanation::focus).
  if (out.png) {
    const auto [layer, head] = e.focus;
    viz::write_heatmap_png(*out.png, e.capture.head(layer, head), e.capture.seq, e.capture.seq);
    fmt::print("wrote {} (layer {} head {})\n", a.png, layer, head);
  }
}

void add_explain_options(CLI::App* cmd, ExplainArgs& a) {
  cmd->add_option("--report", a.report, "Where to write the HTML report")->capture_default_str();
  cmd->add_option("--png", a.png, "Also write the opening head's attention as a PNG heatmap");
  cmd->add_option("--capture-json", a.capture_json,
                  "Also write the capture (tokens, words, statistics, probabilities) as JSON");
  cmd->add_option("--npy", a.npy, "Also write the probabilities [layer, head, T, T] as .npy");
  cmd->add_option("--corpus", a.corpus,
                  "\"detective\" (its validation stories) or a text file (importance scored on "
                  "its first half of lines, pruning judged on the second)")
      ->capture_default_str();
  positive(
      cmd->add_option("--sequences", a.sequences, "Validation sequences for importance and pruning")
          ->capture_default_str());
  positive(cmd->add_option("--seq", a.seq,
                           "Tokens per validation sequence (default: the model's context, at "
                           "most 256)"));
  cmd->add_flag("--no-curve", a.no_curve, "Skip the pruning curves (faster)");
  cmd->add_flag("--no-ablation", a.no_ablation,
                "Skip ablation importance (one evaluation per head: slow on large models)");
  cmd->add_option("--coreference", a.coreference,
                  "Also score every head on natural coreference passages (data/coreference.json)");
  add_threads_option(cmd, a.threads);
  add_dtype_option(cmd, a.dtype);
  cmd->add_flag("--signatures", a.signatures,
                "The model was trained on detective stories with signatures: score coreference "
                "by name from the possessive before the signature");
}

// The demo story as a coreference passage: "she" and its antecedent "Maria", beside "John".
inspect::CorefPassage story_passage() {
  const std::string text = kStory;
  auto at = [&](const std::string& word) { return static_cast<int64_t>(text.find(word)); };
  return {.text = text,
          .pronoun = "she",
          .pronoun_at = at("Later she") + 6,
          .antecedent = {.name = "Maria", .at = at("Maria")},
          .distractors = {{.name = "John", .at = at("John")}}};
}

// The seed's question on a real model, sized for make demo (under a minute and a half on 2 cores
// for SmolLM2): importance from the prose's first half, pruning judged on 4 × 128 held-out tokens,
// curves at 10/20/30/50% against random, no ablation (270 heads), the natural coreference set.
void real_model_demo(const ExplainArgs& base, const std::string& path, const std::string& corpus,
                     const std::vector<inspect::CorefPassage>& passages) {
  load::Model real = load::load_model(path);
  real.net.set_dtype(parse_dtype(base.dtype, "--dtype"));
  const model::GPTConfig& c = real.net.config();
  fmt::print(
      "\n— The same question on a real model: {} ({}, {} layers × {} heads, {} key/value heads "
      "each) —\n\n",
      std::filesystem::path(path).filename().string(), real.architecture, c.n_layer, c.n_head,
      c.n_kv_head);
  ExplainArgs a = base;
  a.report = (std::filesystem::path(base.report).parent_path() /
              ("report-" + std::filesystem::path(path).stem().string() + ".html"))
                 .string();
  a.png.clear();
  a.capture_json.clear();
  a.npy.clear();
  inspect::ExplainOptions o;
  o.data = {.corpus = corpus, .sequences = 4, .seq = 128};
  o.curve_options = {.fractions = {0.1, 0.2, 0.3, 0.5},
                     .methods = {inspect::PruneBy::importance, inspect::PruneBy::random},
                     .random_seeds = 5};
  o.ablation = false;
  o.coreference = passages;
  o.link = story_passage();
  run_explain(real, path, kStory, a, o);
}

}  // namespace

void add_demo(CLI::App& app) {
  struct Args : ExplainArgs {
    std::string model = "models/detective.safetensors";
    std::string text = kStory;
    bool retrain = false;
    std::string real_model, real_corpus = "data/genesis.txt",
                            real_coreference = "data/coreference.json";
  };
  auto a = std::make_shared<Args>();
  a->signatures = inspect::demo_recipe().stages.back().corpus.signatures;  // the model's corpus
  auto* cmd = app.add_subcommand(
      "demo",
      "Which head links \"she\" to \"Maria\", which ones can go: the bundled model analysed");
  cmd->add_option("--model", a->model, "The model to analyse")->capture_default_str();
  cmd->add_option("--text", a->text, "The story")->capture_default_str();
  cmd->add_flag("--retrain", a->retrain,
                "Train the model from scratch first (models/README.md's recipe) into "
                "demo/detective.safetensors");
  add_explain_options(cmd, *a);
  cmd->add_option("--real-model", a->real_model,
                  "Then the same question on a real model (make demo passes SmolLM2's GGUF): "
                  "which heads link \"she\" to \"Maria\", its previous-token and induction "
                  "heads, pruning on held-out prose, and its report beside the first");
  cmd->add_option("--real-corpus", a->real_corpus,
                  "The real model's prose: importance on its first half, pruning judged on the "
                  "second")
      ->capture_default_str();
  cmd->add_option("--real-coreference", a->real_coreference,
                  "The natural coreference passages the real model's heads are scored on")
      ->capture_default_str();
  cmd->callback([a] {
    std::string path = a->model;
    if (a->retrain) {
      path = "demo/detective.safetensors";
      std::filesystem::create_directories("demo");
      ThreadContext ctx(a->threads);
      const inspect::DemoRecipe recipe = inspect::demo_recipe();
      fmt::print(stderr, "retraining: {} stages, {} steps (models/README.md's recipe)\n",
                 recipe.stages.size(), recipe.total_steps());
      const auto res = inspect::train_demo_model(ctx, path, [](const train::StepReport& s) {
        if (s.step % 100 == 0 || s.val_loss)
          fmt::print(stderr, "step {}/{} loss {:.4f}{}\n", s.step, s.steps, s.loss,
                     s.val_loss ? fmt::format(" val {:.4f}", *s.val_loss) : "");
      });
      fmt::print(stderr, "retrained in {:.0f} s: validation loss {:.4f}\n", res.seconds,
                 res.val_loss);
    }
    const inspect::ExplainOptions o = explain_options(*a);
    if (!a->real_model.empty()) {
      check(std::filesystem::exists(a->real_model), "--real-model: {}: no such file or folder",
            a->real_model);
      check(std::filesystem::is_regular_file(a->real_corpus), "--real-corpus: {}: no such file",
            a->real_corpus);
    }
    const auto real_passages = a->real_model.empty()
                                   ? std::vector<inspect::CorefPassage>{}
                                   : inspect::read_coreference_passages(a->real_coreference);
    load::Model loaded = load::load_model(path);
    run_explain(loaded, path, a->text, *a, o);
    if (!a->real_model.empty()) real_model_demo(*a, a->real_model, a->real_corpus, real_passages);
  });
}

void add_explain(CLI::App& app) {
  struct Args : ExplainArgs {
    std::string model, text;
  };
  auto a = std::make_shared<Args>();
  a->report = "report.html";
  auto* cmd = app.add_subcommand("explain", "The head report of any model on any text");
  cmd->add_option("model", a->model,
                  "Checkpoint, Hugging Face folder or .gguf file (a decoder or an embedding "
                  "model)")
      ->required();
  cmd->add_option("text", a->text, "The text")->required();
  add_explain_options(cmd, *a);
  cmd->callback([a] {
    const inspect::ExplainOptions o = explain_options(*a);
    load::Model loaded = load::load_model(a->model);
    run_explain(loaded, a->model, a->text, *a, o);
  });
}

}  // namespace headlight::cli

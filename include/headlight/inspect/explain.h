// The analysis `headlight demo` and `headlight explain` run on a model and a text: the
// continuation, the attention capture, every head's roles and importance, the pruning comparison
// and curve, and a short summary whose numbers are all read from the model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "headlight/inspect/analysis.h"
#include "headlight/inspect/capture.h"
#include "headlight/train/trainer.h"

namespace headlight::inspect {

struct ExplainOptions {
  int64_t new_tokens = 12;  // greedy continuation of the text
  int64_t sequences = 32;   // evaluation sequences for importance and pruning
  int64_t seq = 0;          // tokens per sequence; 0: the model's context, at most 256
  double prune_fraction = 0.3;
  int64_t random_seeds = 5;
  bool curve = true;
  std::string corpus = "detective";
  bool signatures = false;  // see RoleOptions::signatures
};

struct Explanation {
  std::string continuation;
  Capture capture;
  std::vector<HeadRow> heads;
  std::vector<CurvePoint> curve;
  // Pruning prune_fraction of the heads by gradient importance, by ablation importance, and at
  // random (mean over random_seeds); forward times of the full and the two pruned models.
  double loss_full = 0, loss_importance = 0, loss_ablation = 0, loss_random = 0;
  double seconds_full = 0, seconds_pruned = 0, seconds_ablation = 0;
  std::vector<std::string> summary;
};

// The recipe of the bundled demo model (models/README.md; `headlight demo --retrain`): stages,
// each training the previous one's weights with a new optimizer and schedule on the detective
// corpus with its own options (docs/notes/2026-12-03-bundled-model.md, "Two stages"):
//   1. from scratch, recall lines of 4–16 random words after 60% of the stories: the
//      previous-token head, short-range induction and the pronoun circuit (signatures) form;
//   2. recall lines of up to 48 words: the induction heads stretch to the 48-token copies the
//      induction score measures (such lines from the start swamp the stories with unpredictable
//      first copies and nothing is learnt).
struct DemoStage {
  train::CorpusOptions corpus;  // the detective corpus's seed, references and recall lines
  train::TrainOptions train;
};
struct DemoRecipe {
  model::GPTConfig model;  // vocab_size is set from the tokenizer
  int64_t bpe_vocab = 1024;
  int64_t stories = 20000, val_stories = 500;
  std::vector<DemoStage> stages;
  int64_t total_steps() const;
};
DemoRecipe demo_recipe();
// Trains the demo model from scratch with demo_recipe() (BPE tokenizer learnt from the first
// stage's training stories, kept for the others) and writes it to `path`. The result is the last
// stage's, with `seconds` and `steps` summed over all.
train::TrainResult train_demo_model(ThreadContext& ctx, const std::string& path,
                                    const std::function<void(const train::StepReport&)>& on_step);

Explanation explain(ThreadContext& ctx, model::GPT& m, const model::TextTokenizer& tokenizer,
                    const std::string& text, const ExplainOptions& o);

}  // namespace headlight::inspect

// The analysis `headlight demo` and `headlight explain` run on a model and a text: the
// continuation, the attention capture, every head's roles and importance, the pruning comparison
// and curve, and a short summary whose numbers are all read from the model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "headlight/inspect/analysis.h"
#include "headlight/inspect/capture.h"
#include "headlight/inspect/coreference.h"
#include "headlight/train/trainer.h"

namespace headlight::inspect {

struct ExplainOptions {
  int64_t new_tokens = 12;  // greedy continuation of the text
  DataOptions data;         // importance is scored on its first part, pruning judged on the other
  double prune_fraction = 0.3;
  bool curve = true;
  CurveOptions curve_options;  // its random_seeds also average the random pruning
  bool ablation = true;        // ablation importance and pruning by it (an evaluation per head)
  std::vector<CorefPassage> coreference{};  // natural passages every head is scored on
  std::optional<CorefPassage> link{};       // the text's pronoun and names: which heads link them
};

struct Explanation {
  std::string continuation;
  Capture capture;
  std::vector<HeadRow> heads;
  RoleScores uniform;  // the scores of a head that attends uniformly (the baseline)
  std::optional<CorefResult> natural;
  std::optional<PassageWeights> link;
  // The head the report opens with: the one linking the text's pronoun to its antecedent most
  // strongly, else the best on the natural passages, else the best coreference head of the
  // detective stories.
  std::pair<int64_t, int64_t> focus{0, 0};
  std::vector<CurvePoint> curve;
  std::string curve_measure;  // "validation loss" (the detective corpus) or "held-out loss"
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

// A model with a tokenizer and an LM head (a decoder: the text is continued, pruning judged by the
// loss) or pooling (an embedding model: no continuation, pruning judged by the cosine of the
// sentence embeddings); an Error naming what is missing otherwise.
Explanation explain(ThreadContext& ctx, load::Model& model, const std::string& text,
                    const ExplainOptions& o);

}  // namespace headlight::inspect

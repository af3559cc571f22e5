// The analyses behind `headlight heads`, `prune`, `sweep` and `demo`: a table of every head (role
// scores, role, importance), pruning with its effect on loss and speed, pruning curves, and the
// head-count sweep.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "headlight/core/thread_context.h"
#include "headlight/inspect/capture.h"
#include "headlight/inspect/importance.h"
#include "headlight/inspect/roles.h"
#include "headlight/load/model.h"
#include "headlight/model/gpt.h"
#include "headlight/model/text_tokenizer.h"
#include "headlight/model/tokenizer.h"
#include "headlight/train/trainer.h"

namespace headlight::inspect {

// Evaluation sequences from a corpus ("detective": the validation split; else a text file's last
// tenth), tokenized with the model's tokenizer (byte-level when it has none and its vocabulary
// holds bytes). `signatures`: detective stories with signatures (train::CorpusOptions), for a
// model trained on them.
Dataset corpus_dataset(const model::GPTConfig& c, const model::TextTokenizer* tokenizer,
                       const std::string& corpus, int64_t sequences, int64_t seq = 0,
                       bool signatures = false);

// What importance is scored on and pruning judged by (importance.h's Dataset), from a corpus:
//   "detective": the validation stories for both (the bundled model's figures are measured so);
//   a text file: its lines, the first half scoring importance and the second half, held out,
//     judging pruning (data/genesis.txt, for one).
// A model with an LM head gets windows of `seq` tokens of the lines joined (at most `sequences`
// each); an encoder without one but with pooling (an embedding model) gets the lines as
// sentences (special tokens added, cut to max_seq_length; at most 4 · `sequences` each); any
// other model, windows (its importance is not measured: head_table gives NaN).
struct DataOptions {
  std::string corpus = "detective";
  int64_t sequences = 32;
  int64_t seq = 0;  // tokens per window; 0: the model's context, at most 256
  bool signatures = false;
};
struct Datasets {
  Dataset score, held_out;
};
Datasets corpus_datasets(ThreadContext& ctx, load::Model& m, const DataOptions& o);
// Whether the model can be judged on d (an LM loss, or sentences' embeddings).
bool measurable(const model::GPTConfig& c, const Dataset& d);

struct HeadRow {
  int64_t layer = 0, head = 0;
  int64_t kv_head = 0;  // the key/value head it reads (its own in multi-head attention)
  RoleScores scores;
  std::string role;
  double importance = 0;  // gradient importance, normalised per layer (NaN: no LM loss)
  double ablation = 0;    // loss increase with the head's gate at 0 (NaN: no LM loss)
};

// Every head present in the model, layer by layer; `uniform` (optional) receives the role scores
// of a head that attends uniformly (the baseline, score_heads).
std::vector<HeadRow> head_table(ThreadContext& ctx, model::GPT& m,
                                const model::TextTokenizer* tokenizer, const Dataset& d,
                                const RoleOptions& o, RoleScores* uniform = nullptr);
// The head table of a capture alone (attention computed elsewhere, capture_from_probs): the scores
// one text gives (previous_token_text, first_token, self, local; `causal`: whether the rows could
// see only earlier keys); with `repeated` = n the text is n tokens repeated twice (seq = 2n), and
// previous_token and induction are scored on it as score_heads does. What the text cannot give is
// NaN (JSON null, "n/a" in the report): coreference without the detective corpus, importance and
// ablation without the model.
std::vector<HeadRow> capture_head_table(const Capture& c, bool causal, int64_t repeated = 0);
// The head the report opens with: the best coreference head (nullptr when rows is empty).
const HeadRow* focus_head(const std::vector<HeadRow>& rows);
// JSON documents that `headlight` prints with --json and the report draws (viz/report.h):
// [{"layer", "head", "kv_head", "role", "importance", "ablation", "scores": scores_json}, …]
std::string head_table_json(const std::vector<HeadRow>& rows);
// {"previous_token": x, "previous_token_text": x, "first_token": x, "self": x, "local": x,
//  "induction": x, "coreference": x, "coreference_accuracy": x, "coreference_sentence": x,
//  "coreference_sentence_accuracy": x}
std::string scores_json(const RoleScores& s);

enum class PruneBy { importance, ablation, random };
PruneBy parse_prune_by(const std::string& name);
const char* prune_by_name(PruneBy b);

struct PruneResult {
  double loss_before = 0, loss_after = 0;
  double seconds_before = 0, seconds_after = 0;  // median time of a forward pass over the dataset
  std::vector<HeadId> heads_removed;
  std::optional<model::GPT> pruned;
};

// Removes round(fraction × heads) heads chosen by `by` on `score` (importance and ablation: the
// lowest first, step by step in tenths of the heads with the remaining heads re-scored before each
// step, as in Michel et al.; random: seeded) and measures loss and forward time on `judge` before
// and after (the median of timing_runs passes of each model, the two timed alternately).
PruneResult prune_model(ThreadContext& ctx, model::GPT& m, const Dataset& score,
                        const Dataset& judge, double fraction, PruneBy by, uint64_t seed,
                        int64_t timing_runs = 9);

struct CurvePoint {
  std::string method;
  double fraction = 0;
  double loss = 0;  // dataset_loss on the judging data; for random: the mean over the seeds
};
struct CurveOptions {
  std::vector<double> fractions = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9};
  std::vector<PruneBy> methods = {PruneBy::importance, PruneBy::ablation, PruneBy::random};
  int64_t random_seeds = 5;
};
// dataset_loss on `judge` against the fraction removed for each method, ordered by fraction and
// then by the methods' order. Importance and ablation are scored on `score` and prune step by
// step (the remaining heads re-scored with the removed ones off, as in Michel et al.); random is
// the mean over seeds 1 … random_seeds. Heads are switched off through their gates, which computes
// what the physically pruned model computes (tested).
std::vector<CurvePoint> pruning_curve(ThreadContext& ctx, model::GPT& m, const Dataset& score,
                                      const Dataset& judge, const CurveOptions& o = {});
// [{"method", "fraction", "loss"}, …]
std::string curve_json(const std::vector<CurvePoint>& points);

struct SweepRow {
  int64_t heads = 0;
  double val_loss = 0;
  double tokens_per_second = 0;
  double seconds = 0;
  RoleScores best;  // the highest score of each role over the model's heads
};
// Trains the same model with each head count at equal n_embd (each head gets n_embd / heads
// dimensions) for the same steps on the same batches.
struct SweepOptions {
  std::vector<int64_t> heads = {1, 2, 4, 8, 16};
  std::string corpus = "detective";  // or a text file
  int64_t stories = 5000;            // training stories of the detective corpus
  train::CorpusOptions shape;        // its references and recall lines
  train::TrainOptions train;
  DType dtype = DType::f32;  // of each model's products (bf16: mixed-precision training)
};
std::vector<SweepRow> head_sweep(ThreadContext& ctx, const model::GPTConfig& base,
                                 const model::Tokenizer& tokenizer, const SweepOptions& o);
// [{"heads", "val_loss", "tokens_per_second", "seconds", "best_scores": scores_json}, …]
std::string sweep_json(const std::vector<SweepRow>& rows);

}  // namespace headlight::inspect

// The demo's analysis (see headlight/inspect/explain.h).

#include "headlight/inspect/explain.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "headlight/core/error.h"
#include "headlight/model/sampling.h"
#include "headlight/train/corpus.h"

namespace headlight::inspect {

namespace {

const HeadRow* best_by(const std::vector<HeadRow>& rows, double RoleScores::*score) {
  const HeadRow* best = nullptr;
  for (const HeadRow& r : rows)
    if (!best || r.scores.*score > best->scores.*score) best = &r;
  return best;
}

std::string quoted(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return "\"" + out + "\"";
}

// Capitalised words that are not names (sentence openings of the detective stories).
constexpr std::array<std::string_view, 12> kFunctionWords = {
    "The",  "A",     "An",     "In",       "Later", "Then",
    "Next", "After", "Nobody", "Somebody", "Tea",   "Footsteps"};
bool is_function_word(const std::string& w) {
  return std::find(kFunctionWords.begin(), kFunctionWords.end(), w) != kFunctionWords.end();
}

// On the captured text, the word that a head's row of the last pronoun attends to most (its
// tokens' weights summed), among names only (capitalised words that do not open a sentence of the
// stories) or among all earlier words; "" when the text has no pronoun.
std::string pronoun_link(const Capture& cap, int64_t layer, int64_t head, bool names_only) {
  const auto& words = cap.words;
  const std::set<std::string> pronouns = {"she", "he", "She", "He", "her", "his", "its"};
  std::string link;
  for (size_t w = 0; w < words.size(); ++w) {
    if (!pronouns.contains(words[w].text)) continue;
    const float* row = cap.head(layer, head) + words[w].first * cap.seq;
    size_t best = 0;
    double best_w = -1;
    for (size_t k = 0; k < w; ++k) {
      const std::string& t = words[k].text;
      const bool name =
          !t.empty() && std::isupper(static_cast<unsigned char>(t[0])) && !is_function_word(t);
      if (names_only && !name) continue;
      double sum = 0;
      for (int64_t j = words[k].first; j <= words[k].last; ++j) sum += row[j];
      if (sum > best_w) {
        best_w = sum;
        best = k;
      }
    }
    if (best_w >= 0)
      link = fmt::format("; on this text \"{}\" attends most to {} ({:.2f})", words[w].text,
                         quoted(words[best].text), best_w);
  }
  return link;
}

}  // namespace

DemoRecipe demo_recipe() {
  DemoRecipe r;
  r.model = {.n_layer = 4,
             .n_head = 4,
             .n_kv_head = 4,
             .n_embd = 128,
             .block_size = 128,
             .positional = model::Positional::rope};
  // Stage 1: recall lines of up to 16 words; stage 2: the same corpus with lines of up to 48.
  train::CorpusOptions corpus{
      .references = 3, .drills = 0.6, .drill_words = 16, .signatures = true};
  const train::TrainOptions stage1{
      .steps = 4000,
      .batch = 16,
      .schedule = {.lr = 3e-3f, .min_lr = 1e-4f, .warmup = 100, .total = 4000},
      .eval_every = 800,
      .seed = 1337};
  r.stages.push_back({corpus, stage1});
  corpus.drill_words = 48;
  const train::TrainOptions stage2{
      .steps = 400,
      .batch = 16,
      .schedule = {.lr = 2e-3f, .min_lr = 1e-4f, .warmup = 50, .total = 400},
      .eval_every = 200,
      .seed = 1337};
  r.stages.push_back({corpus, stage2});
  return r;
}

int64_t DemoRecipe::total_steps() const {
  int64_t n = 0;
  for (const DemoStage& s : stages) n += s.train.steps;
  return n;
}

train::TrainResult train_demo_model(ThreadContext& ctx, const std::string& path,
                                    const std::function<void(const train::StepReport&)>& on_step) {
  const DemoRecipe r = demo_recipe();
  check(!r.stages.empty(), "demo recipe: no stages");
  std::optional<model::Tokenizer> tok;
  std::optional<model::GPT> m;
  train::TrainResult total;
  for (const DemoStage& stage : r.stages) {
    const train::TextSplits text =
        train::load_text("detective", r.stories, r.val_stories, stage.corpus);
    if (!m) {
      tok.emplace(model::Tokenizer::train_bpe(text.train, r.bpe_vocab));
      model::GPTConfig c = r.model;
      c.vocab_size = tok->vocab_size();
      m.emplace(c, stage.train.seed);
    }
    train::TrainOptions o = stage.train;
    o.out = path;
    const train::TrainResult res = train::train_model(ctx, *m, &*tok, tok->encode(text.train),
                                                      tok->encode(text.validation), o, on_step);
    const double seconds = total.seconds + res.seconds;
    const int64_t steps = total.steps + res.steps;
    total = res;
    total.seconds = seconds;
    total.steps = steps;
  }
  return total;
}

Explanation explain(ThreadContext& ctx, model::GPT& m, const model::TextTokenizer& tokenizer,
                    const std::string& text, const ExplainOptions& o) {
  Explanation e;
  check(m.config().lm_head,
        "explain: the report continues the text and prunes by the LM loss, and this encoder has "
        "no LM head (`headlight heads` gives its roles)");
  auto ids = tokenizer.encode(text);
  check(!ids.empty(), "text: empty");
  const int64_t block = m.config().block_size;
  check(o.seq <= block, "seq: {} is longer than the model's context {}", o.seq, block);
  check(m.config().n_kv_head == m.config().n_head,
        "explain: the report prunes single heads, and a grouped-query model (n_kv_head {} < n_head "
        "{}) cannot lose them yet (`headlight heads` gives its roles and importance)",
        m.config().n_kv_head, m.config().n_head);
  if (static_cast<int64_t>(ids.size()) > block)
    ids.erase(ids.begin(), ids.end() - block);  // the last block_size tokens
  model::SamplingOptions greedy{.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
  const auto next = model::generate(ctx, m, ids, o.new_tokens, greedy);
  e.continuation = tokenizer.decode(next);
  e.capture = capture_tokens(ctx, m, &tokenizer, ids);

  const int64_t len = o.seq > 0 ? o.seq : std::min<int64_t>(block, 256);
  const Dataset d =
      corpus_dataset(m.config(), &tokenizer, o.corpus, o.sequences, len, o.signatures);
  RoleOptions ro;
  ro.coreference_stories = o.corpus == "detective" ? 200 : 0;
  ro.signatures = o.signatures;
  e.heads = head_table(ctx, m, &tokenizer, d, ro);
  if (o.curve) e.curve = pruning_curve(ctx, m, d, o.random_seeds);

  // Pruning by importance against random pruning of the same number of heads.
  const PruneResult by_importance =
      prune_model(ctx, m, d, o.prune_fraction, PruneBy::importance, 0);
  e.loss_full = by_importance.loss_before;
  e.loss_importance = by_importance.loss_after;
  e.seconds_full = by_importance.seconds_before;
  e.seconds_pruned = by_importance.seconds_after;
  const PruneResult by_ablation = prune_model(ctx, m, d, o.prune_fraction, PruneBy::ablation, 0);
  e.loss_ablation = by_ablation.loss_after;
  e.seconds_ablation = by_ablation.seconds_after;
  double random_sum = 0;
  for (int64_t s = 0; s < o.random_seeds; ++s) {
    const auto heads =
        heads_to_remove(m.config(), {}, static_cast<int64_t>(by_importance.heads_removed.size()),
                        static_cast<uint64_t>(s + 1));
    model::GPT pruned = prune_heads(m, heads);
    random_sum += dataset_loss(ctx, pruned, d);
  }
  e.loss_random = random_sum / static_cast<double>(std::max<int64_t>(1, o.random_seeds));

  // The summary: every number comes from the measurements above.
  auto& s = e.summary;
  s.push_back(fmt::format("Continuation: {}{}",
                          text.size() > 60 ? "…" + text.substr(text.size() - 60) : text,
                          e.continuation));
  if (const HeadRow* c = best_by(e.heads, &RoleScores::coreference); c && o.corpus == "detective") {
    const std::string link = pronoun_link(e.capture, c->layer, c->head, true);
    s.push_back(fmt::format(
        "Coreference head: layer {} head {}: its pronoun attends most to the "
        "antecedent for {:.0f}% of the test stories' pronouns (score {:.2f}){}",
        c->layer, c->head, 100 * c->scores.coreference_accuracy, c->scores.coreference, link));
  }
  if (const HeadRow* c = best_by(e.heads, &RoleScores::coreference_sentence);
      c && o.corpus == "detective")
    s.push_back(fmt::format(
        "Pronoun-resolving head: layer {} head {}: its pronoun attends most to the antecedent's "
        "introducing sentence (name, colour, object, place) for {:.0f}% of the test stories' "
        "pronouns (score {:.2f}){}",
        c->layer, c->head, 100 * c->scores.coreference_sentence_accuracy,
        c->scores.coreference_sentence, pronoun_link(e.capture, c->layer, c->head, false)));
  if (const HeadRow* p = best_by(e.heads, &RoleScores::previous_token))
    s.push_back(fmt::format(
        "Previous-token head: layer {} head {} (score {:.2f} on random tokens, {:.2f} on the test "
        "stories)",
        p->layer, p->head, p->scores.previous_token, p->scores.previous_token_text));
  if (const HeadRow* i = best_by(e.heads, &RoleScores::induction))
    s.push_back(fmt::format("Induction head: layer {} head {} (score {:.2f})", i->layer, i->head,
                            i->scores.induction));
  s.push_back(fmt::format(
      "Pruning {:.0f}% of the heads ({}): validation loss {:.4f} → {:.4f} ({:+.4f}) by gradient "
      "importance (Michel et al.), → {:.4f} ({:+.4f}) by ablation importance, → {:.4f} ({:+.4f}) "
      "at random (mean of {} seeds); the pruned models' forward passes take {:.2f}× and {:.2f}× "
      "the time of the full one",
      100 * o.prune_fraction, by_importance.heads_removed.size(), e.loss_full, e.loss_importance,
      e.loss_importance - e.loss_full, e.loss_ablation, e.loss_ablation - e.loss_full,
      e.loss_random, e.loss_random - e.loss_full, o.random_seeds, e.seconds_pruned / e.seconds_full,
      e.seconds_ablation / e.seconds_full));
  return e;
}

}  // namespace headlight::inspect

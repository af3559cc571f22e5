// Head roles: each a score in [0, 1], computed from exact attention.
//
//   previous_token  mean over query rows i ≥ 1 of P[i, i−1], on the induction sequences below:
//                   random tokens, where content gives no cue and only a head's positional rule
//                   shows (Olsson et al. 2022 identify previous-token heads this way)
//   previous_token_text  the same mean on a text: on stories heads are content-dependent (one
//                   may look at the previous token after a colour and at the subject from a full
//                   stop), so this is lower for the same head
//   first_token     mean over rows i ≥ 1 of P[i, 0]: the "sink"                (on a text)
//   self            mean over rows of P[i, i]                                   (on a text)
//   local           1 − (mean attention distance) / (that of uniform attention: i/2 at row i when
//                   causal, the mean distance to every key in an encoder), clipped to [0, 1]: 1
//                   when every row looks at itself or its neighbours
//   induction       on sequences of random tokens repeated twice, r₁…r_n r₁…r_n: the mean over the
//                   second copy's rows of the weight on the token after the earlier occurrence of
//                   the query's token (P[n + k, k + 1]); the tokens are drawn from those of the
//                   model's corpus
//   coreference     on the detective corpus's test stories: the pronoun's attention summed over
//                   each character mention's tokens (the pronoun: the possessive before the
//                   answer, or, in stories with signatures, the one before the signature, whose
//                   continuation needs the antecedent's identity); accuracy = how often the
//                   antecedent gets the most; the score is that accuracy above chance (1 / number
//                   of characters), rescaled to [0, 1]: (accuracy − chance) / (1 − chance), clipped
//                   at 0
//   coreference_sentence  the same with each character's whole introducing sentence ("Maria
//                   found a red key in the kitchen.") in place of its name: a head can resolve
//                   the pronoun by attending to the antecedent's colour or object rather than to
//                   its name (the colour's own context tells whose it is), which this shows and
//                   the name-based score does not. Not used for the role.
//
// A head's role is the highest of previous_token, first_token, induction and coreference when it
// reaches 0.5, else "local" when local ≥ 0.5, else "self" when self ≥ 0.5, else "mixed".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"
#include "headlight/model/text_tokenizer.h"
#include "headlight/model/tokenizer.h"
#include "headlight/train/corpus.h"

namespace headlight::inspect {

struct RoleScores {
  double previous_token = 0, first_token = 0, self = 0, local = 0, induction = 0, coreference = 0;
  double previous_token_text = 0;
  double coreference_accuracy = 0;  // raw fraction of pronouns whose antecedent gets the most
  // The same with each character's whole introducing sentence in place of its name.
  double coreference_sentence = 0, coreference_sentence_accuracy = 0;
};

// Scores that need one attention matrix p [seq, seq] (a causal or full row-stochastic matrix;
// `causal` sets the uniform distance `local` is measured against: i/2 at row i, or the mean
// distance to all seq keys).
void text_scores(const float* p, int64_t seq, RoleScores& s, bool causal = true);
// The induction score of p [2n, 2n] for a sequence made of n tokens repeated twice.
double induction_score(const float* p, int64_t n);
// The coreference accuracy of p for one story: the index of the mention (each a token range
// [first, last]) the pronoun's row gives the most weight.
int64_t most_attended_mention(const float* p, int64_t seq, int64_t pronoun_token,
                              const std::vector<std::pair<int64_t, int64_t>>& mentions);

std::string role_of(const RoleScores& s);

struct RoleOptions {
  std::string text;  // the text of the text-based scores ("" → test stories)
  int64_t induction_sequences = 4;
  int64_t induction_length = 0;  // tokens per copy (0: min(block_size / 2, 48))
  int64_t coreference_stories = 200;
  uint64_t seed = 1;
  // Test stories with signatures (train::CorpusOptions::signatures), for a model trained on
  // them: the name-based coreference is then scored from the possessive before the signature.
  bool signatures = false;
  // Tokens the induction sequences are drawn from (empty: the whole vocabulary). A model knows only
  // the tokens of its corpus; head_table passes those of its evaluation data.
  std::vector<int32_t> induction_tokens;
  // head_table: also ablation importance (one evaluation of the dataset per head: slow for a model
  // of hundreds of heads; NaN when off).
  bool ablation = true;
  // Fewer pronouns than this (stories longer than block_size are skipped) leave the coreference
  // scores at 0: too few to measure.
  int64_t min_pronouns = 30;
};

// Scores of every head, [n_layer × n_head] (layer major); heads a pruned layer lacks get zeros.
// `uniform`, when given, receives the baseline: the scores of a head that attends uniformly (each
// row spread evenly over the keys it may see) on the same sequences by the same code.
std::vector<RoleScores> score_heads(ThreadContext& ctx, model::GPT& m,
                                    const model::TextTokenizer* tokenizer, const RoleOptions& o,
                                    RoleScores* uniform = nullptr);

// The token of each byte offset: token_at[b] for a byte b of the text `tokens` decode to.
std::vector<int64_t> byte_to_token(const model::TextTokenizer& t,
                                   const std::vector<int32_t>& tokens);

}  // namespace headlight::inspect

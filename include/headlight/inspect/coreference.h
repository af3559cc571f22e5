// Coreference on natural text: short passages, each with a pronoun, its antecedent and other
// names it could wrongly link to (data/coreference.json, data/README.md). A head is right on a
// passage when the pronoun's row attends more to the antecedent's span than to every other name's
// span, a name of several tokens counting as one span (the sum of its tokens' weights). Scored
// through the model's own tokenizer: character offsets map to tokens by aligning the tokens'
// text with the passage's (case and spaces aside), so WordPiece and byte-level BPE both work; the
// pronoun's row is its first token's. The baseline is the rule "the nearest preceding name".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"
#include "headlight/model/text_tokenizer.h"

namespace headlight::inspect {

struct CorefName {
  std::string name;
  int64_t at = 0;  // byte offset into the text
};

struct CorefPassage {
  std::string text;
  std::string pronoun;
  int64_t pronoun_at = 0;  // byte offset into the text
  CorefName antecedent;
  std::vector<CorefName> distractors;
};

// Reads and checks data/coreference.json's form (character offsets converted to byte offsets);
// errors name the file, the passage and the field.
std::vector<CorefPassage> read_coreference_passages(const std::string& path);

struct CorefResult {
  int64_t passages = 0;              // scored (fitting the context, aligned with their tokens)
  std::vector<double> accuracy;      // [n_layer, n_head]: fraction of passages a head gets right
  double nearest_name_accuracy = 0;  // the rule "the nearest preceding name"
};

// One passage through the model: every head's attention from the pronoun's row to each name's
// span, weights[(l · n_head + h) · names + k] with k = 0 the antecedent and then the distractors in
// order. Absent when the passage is longer than the context, its text does not align with its
// tokens, or a name does not end before the pronoun's token.
struct PassageWeights {
  int64_t names = 0;
  std::vector<double> weights;
  bool nearest_is_antecedent = false;  // the nearest-name rule is right here
  double weight(int64_t layer, int64_t head, int64_t n_head, int64_t name) const {
    return weights[static_cast<size_t>((layer * n_head + head) * names + name)];
  }
  // Whether the head attends more to the antecedent than to every other name.
  bool right(int64_t layer, int64_t head, int64_t n_head) const;
};
std::optional<PassageWeights> passage_weights(ThreadContext& ctx, model::GPT& m,
                                              const model::TextTokenizer& tokenizer,
                                              const CorefPassage& p);

CorefResult natural_coreference(ThreadContext& ctx, model::GPT& m,
                                const model::TextTokenizer& tokenizer,
                                const std::vector<CorefPassage>& passages);

// {"passages": n, "nearest_name_accuracy": x, "accuracy": [[head accuracy, …] per layer]}, the
// document `headlight heads --coreference FILE --json` prints under "coreference".
std::string coreference_json(const CorefResult& r, int64_t n_layer, int64_t n_head);

// The token (index into ids) of each byte of `text`: −1 for spaces no token holds. Tokens whose
// text does not come next in the passage (special tokens) hold no bytes. Throws when some
// non-space byte is left to no token (a tokenizer that drops or changes characters).
std::vector<int64_t> token_of_byte(const model::TextTokenizer& tokenizer,
                                   const std::vector<int32_t>& ids, const std::string& text);

}  // namespace headlight::inspect

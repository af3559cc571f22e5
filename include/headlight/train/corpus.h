// The detective corpus: a seeded generator of short stories in which a pronoun must be linked to
// its antecedent to predict what follows, the task a coreference head solves:
//
//   Maria found a red key in the kitchen. John found a blue map in the garden. The rain did not
//   stop. Later she opened the door with the red key.
//
// Two or three characters of different grammatical gender (she, he, and for a third character an
// animal referred to as "it") are introduced, each with an object, a colour and a place; one to
// three distractor sentences follow; then a sentence refers to one character by pronoun and
// continues with that character's colour and object. Splits (train, validation, test) draw from
// separate seeds. Each story records where the pronoun, every name and the answer are (byte offsets
// into the text, which are token positions under the byte-level tokenizer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace headlight::train {

enum class Split : uint8_t { train, validation, test };
Split parse_split(const std::string& name);
const char* split_name(Split s);

struct Mention {
  std::string name;    // "Maria", "John", "the dog"
  int64_t offset = 0;  // byte offset of the name's first byte in the story
  int64_t length = 0;
  std::string pronoun;  // "she", "he" or "it"
};

// One sentence that refers to a character by pronoun and continues with its colour and object.
struct Reference {
  int64_t antecedent = 0;  // index into the story's characters
  std::string pronoun;     // "she", "he" or "it"
  int64_t pronoun_offset = 0;
  std::string answer;  // "red key": the antecedent's colour and object
  int64_t answer_offset = 0;
};

struct Story {
  std::string text;                 // one story, ending with ".\n"
  std::vector<Mention> characters;  // in order of introduction
  int64_t antecedent = 0;           // index into characters of the one the pronoun refers to
  std::string pronoun;              // "she", "he" or "it"
  int64_t pronoun_offset = 0;
  std::string answer;         // "red key": the antecedent's colour and object
  int64_t answer_offset = 0;  // where the answer starts in the last sentence
  // Every reference sentence (the fields above repeat the first); more than one when
  // CorpusOptions::references > 1.
  std::vector<Reference> references;
};

struct CorpusOptions {
  Split split = Split::train;
  int64_t stories = 1000;
  uint64_t seed = 1;  // the base seed; each split derives its own stream from it
  // Reference sentences per story ("Later she …", then "Then he …"): 1 as in the examples; more
  // give a model more pronouns to resolve per story (the demo model is trained with 3).
  int64_t references = 1;
  // Probability that a story is followed by a recall line: 4 to 10 words of the corpus's
  // vocabulary, then the same words again ("red Maria garden key | red Maria garden key"). Such
  // lines reward copying from context (induction heads); 0 in the examples.
  double drills = 0.0;
};

std::vector<Story> detective_stories(const CorpusOptions& o);
// The stories' texts concatenated (each ends with a newline).
std::string corpus_text(const std::vector<Story>& stories);

// Training and validation text: "detective" generates `train_stories` and `val_stories` stories
// from their splits; anything else is the path of a text file, whose last tenth is the validation
// text. Throws Error naming `corpus` when the file cannot be read or is too short.
struct TextSplits {
  std::string train, validation;
};
TextSplits load_text(const std::string& corpus, int64_t train_stories, int64_t val_stories,
                     uint64_t seed, int64_t references = 1, double drills = 0.0);

}  // namespace headlight::train

// The detective corpus: a seeded generator of short stories in which a pronoun must be linked to
// its antecedent to predict what follows, the task a coreference head solves:
//
//   The red key for Maria lay in the kitchen. In the garden, a blue map for John was found.
//   The rain did not stop. Later she opened the door with her red key.
//
// Two or three characters of different grammatical gender (she, he, and for a third character an
// animal referred to as "it") are introduced, each with an object, a colour and a place (the
// object and colour first, then the owner's name, in one of three forms); one to three
// distractor sentences follow; then a sentence refers to one character by pronoun and continues
// with that character's colour and object (with `signatures`, it first puts on the character's
// signature: "Later she put on her scarf and opened the door with her red key."). Splits (train,
// validation, test) draw from separate seeds. Each story records where the pronoun, every name and
// the answer are (byte offsets into the text, which are token positions under the byte-level
// tokenizer).
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
  // The sentence that introduces the character (name, object, colour and place), its bytes
  // [sentence_offset, sentence_offset + sentence_length), full stop included.
  int64_t sentence_offset = 0;
  int64_t sentence_length = 0;
};

// One sentence that refers to a character by pronoun and continues with its colour and object:
// "Later she opened the door with her red key." The possessive right before the answer is the
// pronoun whose antecedent must be found to predict what follows.
struct Reference {
  int64_t antecedent = 0;  // index into the story's characters
  std::string pronoun;     // the possessive before the answer: "her", "his" or "its"
  int64_t pronoun_offset = 0;
  std::string subject;  // the sentence's subject pronoun: "she", "he" or "it"
  int64_t subject_offset = 0;
  std::string answer;  // "red key": the antecedent's colour and object
  int64_t answer_offset = 0;
  // With CorpusOptions::signatures: the antecedent's signature ("scarf") after a possessive of
  // its own ("Later she put on her scarf and opened the door with her red key."); -1 without.
  std::string signature;
  int64_t signature_pronoun_offset = -1;  // the possessive before the signature
  int64_t signature_offset = -1;
};

struct Story {
  std::string text;                 // one story, ending with ".\n"
  std::vector<Mention> characters;  // in order of introduction
  int64_t antecedent = 0;           // index into characters of the one the pronoun refers to
  std::string pronoun;              // the first reference's possessive: "her", "his" or "its"
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
  // Probability that a story is followed by a recall line: 4 to `drill_words` words drawn at
  // random from every word of the corpus (names, colours, objects, places and the words of the
  // other sentences), then the same words again with nothing between the copies ("red Maria
  // rain key red Maria rain key"). Only a model that notices the repetition by content can
  // predict the second copy: such lines reward induction heads (and the previous-token heads they
  // build on). 0 in the examples.
  double drills = 0.0;
  int64_t drill_words = 10;
  // How a recall line's length is drawn from [4, drill_words]: uniformly, or log-uniformly (as
  // many lines of 4–8 words as of 8–16 and of 16–32: short lines to discover copying by, long
  // ones to carry it over the distance of a long line).
  bool drill_log_lengths = false;
  // Probability that a story is followed by an echo line: a run of 6 to 20 consecutive words of
  // the story itself, repeated on a line of its own ("door with her red key. Then he hid"). Its
  // first occurrence lies a story's length back (50 to 100 tokens), farther than recall lines'
  // copies, and costs no unpredictable text. 0 in the examples.
  double echoes = 0.0;
  // Every character of the corpus has a signature, the same in every story and never named in
  // the story's text: Maria always wears her scarf, John his coat, the dog its collar. With this
  // on, each reference sentence first puts it on ("Later she put on her scarf and opened the door
  // with her red key."): predicting "scarf" after "her" needs the antecedent's identity, which
  // only its name carries, where the colour can be read from the introducing sentence's own
  // words. It is what teaches a model a head that links the pronoun to the antecedent's name.
  bool signatures = false;
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
// `shape` gives the detective corpus's seed, references and drills (its split and story count are
// set per split).
TextSplits load_text(const std::string& corpus, int64_t train_stories, int64_t val_stories,
                     const CorpusOptions& shape = {});

}  // namespace headlight::train

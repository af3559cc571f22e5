// The detective corpus generator (see headlight/train/corpus.h).

#include "headlight/train/corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <sstream>

#include "headlight/core/error.h"
#include "headlight/core/rng.h"

namespace headlight::train {

namespace {

constexpr std::array kWomen = {"Maria", "Anna", "Sophie", "Emma",  "Clara", "Julia",
                               "Laura", "Nora", "Lucy",   "Helen", "Rosa",  "Alice"};
constexpr std::array kMen = {"John",  "Peter", "David",  "Tom",   "Mark", "Paul",
                             "James", "Oscar", "Victor", "Henry", "Leo",  "Frank"};
constexpr std::array kAnimals = {"the dog", "the cat", "the parrot", "the fox"};
// Signatures (CorpusOptions::signatures): kWomen[i] and kMen[i] wear kSignatures[i], kAnimals[i]
// kAnimalSignatures[i].
constexpr std::array kSignatures = {"scarf", "hat",    "coat", "shawl", "apron",  "cloak",
                                    "beret", "jacket", "vest", "boots", "bonnet", "cap"};
constexpr std::array kAnimalSignatures = {"collar", "bell", "ribbon", "harness"};
static_assert(kSignatures.size() == kWomen.size() && kSignatures.size() == kMen.size() &&
              kAnimalSignatures.size() == kAnimals.size());
constexpr std::array kObjects = {"key",  "map",   "coin", "letter", "book",  "lamp",
                                 "ring", "knife", "box",  "watch",  "photo", "glove"};
constexpr std::array kColours = {"red",   "blue",   "green",  "yellow", "black",
                                 "white", "silver", "golden", "brown",  "purple"};
constexpr std::array kPlaces = {"kitchen", "garden", "library", "hall",   "attic",
                                "cellar",  "study",  "garage",  "church", "station"};
constexpr std::array kDistractors = {"The rain did not stop.",
                                     "Nobody said a word.",
                                     "The clock struck nine.",
                                     "A car passed in the street.",
                                     "The lights went out for a moment.",
                                     "Somebody knocked twice.",
                                     "The wind shook the windows.",
                                     "Tea was served in the hall.",
                                     "The inspector took notes.",
                                     "A train whistled far away.",
                                     "The fire was almost out.",
                                     "Footsteps echoed upstairs."};
constexpr std::array kThen = {"Then", "After that", "Next"};
constexpr std::array kEndings = {
    "opened the door with", "showed everyone", "picked up", "looked again at", "hid",
    "gave the police"};

const char* possessive(const std::string& pronoun) {
  return pronoun == "she" ? "her" : pronoun == "he" ? "his" : "its";
}

template <typename A>
const char* pick(const A& options, Generator& g) {
  return options[g.next_u32() % options.size()];
}

// The signature of a character of the lists above.
std::string signature_of(const std::string& name) {
  for (size_t i = 0; i < kWomen.size(); ++i)
    if (name == kWomen[i] || name == kMen[i]) return kSignatures[i];
  for (size_t i = 0; i < kAnimals.size(); ++i)
    if (name == kAnimals[i]) return kAnimalSignatures[i];
  fail("signature: unknown character \"{}\"", name);
}

// Distinct indices into an array of n options.
std::vector<size_t> distinct(size_t n, size_t k, Generator& g) {
  std::vector<size_t> out;
  while (out.size() < k) {
    const size_t i = g.next_u32() % n;
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  }
  return out;
}

std::string capitalised(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

// The words of recall lines: every distinct word of the arrays above (names, animals, objects,
// colours, places, distractors, connectives, endings; punctuation removed) and a few frame words.
const std::vector<std::string>& drill_pool() {
  static const std::vector<std::string> pool = [] {
    std::vector<std::string> words;
    auto add = [&](const std::string& text) {
      std::istringstream in(text);
      for (std::string w; in >> w;) {
        std::erase_if(w, [](char c) { return c == '.' || c == ','; });
        if (!w.empty() && std::find(words.begin(), words.end(), w) == words.end())
          words.push_back(w);
      }
    };
    for (const auto* list : {&kWomen, &kMen})
      for (const char* w : *list) add(w);
    for (const char* w : kAnimals) add(w);
    for (const char* w : kObjects) add(w);
    for (const char* w : kColours) add(w);
    for (const char* w : kPlaces) add(w);
    for (const char* w : kDistractors) add(w);
    for (const char* w : kThen) add(w);
    for (const char* w : kEndings) add(w);
    // Frame words of sentences not in the arrays above ("saw" and "near" occur only in recall
    // lines: extra words that keep the recall lines of the bundled model's corpus as they were).
    add("found a saw near In Later she he it");
    return words;
  }();
  return pool;
}

// The characters of a story (name, pronoun) with each one's object and colour.
struct Cast {
  std::vector<std::pair<std::string, std::string>> chars;
  std::vector<size_t> objects, colours;  // indices into kObjects and kColours, one per character
};

// The introducing sentences (one per character: "The red key for Maria lay in the kitchen.") and
// 1–3 distractor sentences.
Cast introduce(Generator& g, Story& st) {
  const bool three = g.next_u32() % 3 == 0;
  const bool woman_first = g.next_u32() % 2 == 0;
  Cast cast;
  auto& chars = cast.chars;
  const std::string woman = pick(kWomen, g), man = pick(kMen, g);
  if (woman_first) {
    chars = {{woman, "she"}, {man, "he"}};
  } else {
    chars = {{man, "he"}, {woman, "she"}};
  }
  if (three) chars.insert(chars.begin() + g.next_u32() % 3, {pick(kAnimals, g), "it"});
  cast.objects = distinct(kObjects.size(), chars.size(), g);
  cast.colours = distinct(kColours.size(), chars.size(), g);
  const auto places = distinct(kPlaces.size(), chars.size(), g);
  const auto& objects = cast.objects;
  const auto& colours = cast.colours;
  for (size_t c = 0; c < chars.size(); ++c) {
    if (!st.text.empty()) st.text += ' ';
    const auto sentence = static_cast<int64_t>(st.text.size());
    const std::string name = chars[c].first;
    const std::string obj = std::string(kColours[colours[c]]) + " " + kObjects[objects[c]];
    const std::string place = kPlaces[places[c]];
    const uint32_t form = g.next_u32() % 3;
    // The object and its colour come before the owner's name: "The red key for Maria lay in
    // the kitchen."
    if (form == 0) st.text += capitalised("a " + obj) + " for ";
    if (form == 1) st.text += "In the " + place + ", a " + obj + " for ";
    if (form == 2) st.text += "The " + obj + " for ";
    st.characters.push_back({name, static_cast<int64_t>(st.text.size()),
                             static_cast<int64_t>(name.size()), chars[c].second});
    st.text += name + (form == 0   ? " was in the " + place + "."
                       : form == 1 ? " was found."
                                   : " lay in the " + place + ".");
    Mention& m = st.characters.back();
    m.sentence_offset = sentence;
    m.sentence_length = static_cast<int64_t>(st.text.size()) - sentence;
  }
  const int64_t distractors = 1 + g.next_u32() % 3;
  for (size_t idx : distinct(kDistractors.size(), static_cast<size_t>(distractors), g))
    st.text += std::string(" ") + kDistractors[idx];
  return cast;
}

// The reference sentences: a pronoun whose antecedent only the introductions tell ("Later she put
// on her scarf and gave the police her red key.").
void add_references(const CorpusOptions& o, const Cast& cast, Generator& g, Story& st) {
  const auto& chars = cast.chars;
  const auto& objects = cast.objects;
  const auto& colours = cast.colours;
  for (int64_t r = 0; r < o.references; ++r) {
    Reference ref;
    ref.antecedent = g.next_u32() % chars.size();
    const size_t a = static_cast<size_t>(ref.antecedent);
    ref.subject = chars[a].second;
    ref.pronoun = possessive(ref.subject);
    st.text += r == 0 ? " Later " : std::string(" ") + pick(kThen, g) + " ";
    ref.subject_offset = static_cast<int64_t>(st.text.size());
    st.text += ref.subject + " ";
    if (o.signatures) {
      st.text += "put on ";
      ref.signature_pronoun_offset = static_cast<int64_t>(st.text.size());
      ref.signature = signature_of(chars[a].first);
      st.text += ref.pronoun + " ";
      ref.signature_offset = static_cast<int64_t>(st.text.size());
      st.text += ref.signature + " and ";
    }
    st.text += std::string(pick(kEndings, g)) + " ";
    ref.pronoun_offset = static_cast<int64_t>(st.text.size());
    st.text += ref.pronoun + " ";
    ref.answer = std::string(kColours[colours[a]]) + " " + kObjects[objects[a]];
    ref.answer_offset = static_cast<int64_t>(st.text.size());
    st.text += ref.answer + ".";
    st.references.push_back(ref);
  }
}

// A recall line: random words of the corpus, then the same words again (CorpusOptions::drills).
void add_recall_line(const CorpusOptions& o, Generator& g, Story& st) {
  const auto& pool = drill_pool();
  const auto most = static_cast<double>(o.drill_words);
  const auto n = static_cast<uint32_t>(
      o.drill_log_lengths
          ? std::min(most, std::floor(4.0 * std::pow((most + 1.0) / 4.0, g.uniform())))
          : 4 + g.next_u32() % static_cast<uint32_t>(o.drill_words - 3));
  std::string words;
  for (uint32_t w = 0; w < n; ++w) words += (w ? " " : "") + pool[g.next_u32() % pool.size()];
  st.text += words + " " + words + "\n";
}

// An echo line: a run of the story's own words again, as far from its first occurrence as the
// story is long: copying it needs an induction head that works over that distance.
void add_echo_line(Generator& g, Story& st) {
  std::vector<std::string> words;
  std::istringstream in(st.text.substr(0, st.text.find('\n')));
  for (std::string w; in >> w;) words.push_back(w);
  const size_t n = std::min<size_t>(words.size(), 6 + g.next_u32() % 15);
  const size_t from = g.next_u32() % (words.size() - n + 1);
  std::string echo;
  for (size_t w = from; w < from + n; ++w) echo += (w > from ? " " : "") + words[w];
  st.text += echo + "\n";
}

}  // namespace

Split parse_split(const std::string& name) {
  if (name == "train") return Split::train;
  if (name == "validation" || name == "val") return Split::validation;
  if (name == "test") return Split::test;
  fail("split: expected train, validation or test, got \"{}\"", name);
}

const char* split_name(Split s) {
  return s == Split::train ? "train" : s == Split::validation ? "validation" : "test";
}

std::vector<Story> detective_stories(const CorpusOptions& o) {
  check(o.stories >= 0, "stories: must be ≥ 0, got {}", o.stories);
  check(o.references >= 1 && o.references <= 8, "references: must be in [1, 8], got {}",
        o.references);
  check(o.drills >= 0 && o.drills <= 1, "drills: must be in [0, 1], got {}", o.drills);
  check(o.echoes >= 0 && o.echoes <= 1, "echoes: must be in [0, 1], got {}", o.echoes);
  check(o.drill_words >= 4 && o.drill_words <= 64, "drill_words: must be in [4, 64], got {}",
        o.drill_words);
  // Each split has its own stream: the seed mixed with the split through Philox.
  const auto key = philox4x32(o.seed, 0xC0F1, static_cast<uint64_t>(o.split));
  Generator g((static_cast<uint64_t>(key[0]) << 32) | key[1]);
  std::vector<Story> out;
  out.reserve(static_cast<size_t>(o.stories));
  for (int64_t s = 0; s < o.stories; ++s) {
    Story st;
    const Cast cast = introduce(g, st);
    add_references(o, cast, g, st);
    st.text += "\n";
    if (o.drills > 0 && g.uniform() < o.drills) add_recall_line(o, g, st);
    if (o.echoes > 0 && g.uniform() < o.echoes) add_echo_line(g, st);
    const Reference& first = st.references.front();
    st.antecedent = first.antecedent;
    st.pronoun = first.pronoun;
    st.pronoun_offset = first.pronoun_offset;
    st.answer = first.answer;
    st.answer_offset = first.answer_offset;
    out.push_back(std::move(st));
  }
  return out;
}

std::string corpus_text(const std::vector<Story>& stories) {
  std::string text;
  for (const Story& s : stories) text += s.text;
  return text;
}

TextSplits load_text(const std::string& corpus, int64_t train_stories, int64_t val_stories,
                     const CorpusOptions& shape) {
  if (corpus == "detective") {
    CorpusOptions o = shape;
    o.split = Split::train;
    o.stories = train_stories;
    std::string train = corpus_text(detective_stories(o));
    o.split = Split::validation;
    o.stories = val_stories;
    return {std::move(train), corpus_text(detective_stories(o))};
  }
  std::ifstream in(corpus, std::ios::binary);
  check(in.good(), "corpus: cannot read \"{}\" (expected \"detective\" or a text file)", corpus);
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  check(text.size() >= 64, "corpus: \"{}\" holds {} bytes, too little to train on", corpus,
        text.size());
  const size_t cut = text.size() - text.size() / 10;
  return {text.substr(0, cut), text.substr(cut)};
}

}  // namespace headlight::train

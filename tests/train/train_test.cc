// The detective corpus, the training loop (loss goes down, resume is exact) and checkpoints.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "headlight/train/checkpoint.h"
#include "headlight/train/corpus.h"
#include "headlight/train/trainer.h"
#include "test_util.h"

namespace headlight::train {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

TEST(Corpus, StoriesRecordWhereThePronounNamesAndAnswerAre) {
  const auto stories = detective_stories({Split::test, 300, 4});
  int three = 0, she = 0;
  for (const Story& s : stories) {
    ASSERT_TRUE(s.text.ends_with(".\n"));
    ASSERT_GE(s.characters.size(), 2u);
    three += s.characters.size() == 3;
    she += s.pronoun == "she";
    EXPECT_EQ(s.text.substr(s.pronoun_offset, s.pronoun.size()), s.pronoun);
    EXPECT_EQ(s.text.substr(s.answer_offset, s.answer.size()), s.answer);
    for (const Mention& m : s.characters)
      EXPECT_EQ(lower(s.text.substr(m.offset, m.length)), lower(m.name));
    // The answer is the antecedent's, stated in its introduction.
    const Mention& a = s.characters[s.antecedent];
    const size_t end = s.text.find('.', a.offset);
    EXPECT_NE(s.text.substr(0, end).rfind(s.answer), std::string::npos) << s.text;
    // The pronoun is unambiguous: no other character has its gender.
    int same = 0;
    for (const Mention& m : s.characters) same += m.pronoun == s.pronoun;
    EXPECT_EQ(same, 1) << s.text;
    EXPECT_EQ(s.characters[s.antecedent].pronoun, s.pronoun);
  }
  EXPECT_GT(three, 50);
  EXPECT_GT(she, 100);
  EXPECT_LT(she, 200);
  // Seeded, and the splits differ.
  EXPECT_EQ(corpus_text(detective_stories({Split::test, 20, 4})),
            corpus_text(detective_stories({Split::test, 20, 4})));
  EXPECT_NE(corpus_text(detective_stories({Split::test, 20, 4})),
            corpus_text(detective_stories({Split::train, 20, 4})));
}

TEST(Corpus, SeveralReferencesPerStory) {
  const auto stories = detective_stories({Split::validation, 50, 2, 3});
  for (const Story& s : stories) {
    ASSERT_EQ(s.references.size(), 3u);
    EXPECT_EQ(s.references[0].pronoun_offset, s.pronoun_offset);
    for (const Reference& r : s.references) {
      EXPECT_EQ(s.text.substr(r.pronoun_offset, r.pronoun.size()), r.pronoun);
      EXPECT_EQ(s.text.substr(r.answer_offset, r.answer.size()), r.answer);
      EXPECT_EQ(s.characters[r.antecedent].pronoun, r.pronoun);
    }
  }
  testing::expect_error([] { detective_stories({Split::train, 1, 1, 0}); }, {"references"});
}

model::GPTConfig tiny() {
  model::GPTConfig c;
  c.vocab_size = 256;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.block_size = 64;
  return c;
}

std::vector<int32_t> ids(const std::string& s) {
  return model::Tokenizer::byte_level().encode(s);
}

TEST(Trainer, LearnsTheDetectiveCorpus) {
  const auto train = ids(corpus_text(detective_stories({Split::train, 2000, 1})));
  const auto val = ids(corpus_text(detective_stories({Split::validation, 100, 1})));
  model::GPT m(tiny(), 1);
  ThreadContext ctx(2);
  const double before = evaluate(ctx, m, val, 16, 64, 4, 0.15f);
  TrainOptions o;
  o.steps = 200;
  o.batch = 16;
  o.schedule = {3e-3f, 3e-4f, 20, 200};
  o.eval_every = 200;
  o.eval_batches = 4;
  const TrainResult r = train_model(ctx, m, nullptr, train, val, o);
  EXPECT_NEAR(before, std::log(256.0), 0.2);  // an untrained byte model is near uniform
  // Stated bound: 200 steps of a 2-layer, n_embd 32 model bring the validation loss from ln 256 =
  // 5.55 to below 2.6 nats per byte (measured: about 2.2); the spelling of the stories' words is
  // learnt first.
  EXPECT_LT(r.val_loss, 2.6);
  EXPECT_EQ(r.steps, 200);
}

TEST(Trainer, ResumingGivesExactlyTheUninterruptedRun) {
  const auto train = ids(corpus_text(detective_stories({Split::train, 200, 1})));
  const auto val = ids(corpus_text(detective_stories({Split::validation, 20, 1})));
  const auto dir = std::filesystem::temp_directory_path() / "hl_resume_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.safetensors").string();
  model::GPTConfig c = tiny();
  c.dropout = 0.1f;
  TrainOptions o;
  o.steps = 12;
  o.batch = 4;
  o.seq = 32;
  o.schedule = {1e-3f, 1e-4f, 3, 12};
  o.eval_every = 6;
  o.eval_batches = 1;
  ThreadContext ctx(2);
  model::GPT straight(c, 5);
  train_model(ctx, straight, nullptr, train, val, o);

  model::GPT first(c, 5);
  TrainOptions half = o;
  half.steps = 6;  // same schedule (total 12), stopped halfway with a checkpoint
  half.out = path;
  train_model(ctx, first, nullptr, train, val, half);
  LoadedModel loaded = load_model(path);
  TrainOptions rest = o;
  rest.out = path;
  rest.resume = true;
  const TrainResult r = train_model(ctx, loaded.model, nullptr, train, val, rest);
  EXPECT_EQ(r.steps, 12);
  EXPECT_EQ(std::memcmp(straight.params(), loaded.model.params(),
                        sizeof(float) * straight.layout().total()),
            0);
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, StoresTheTokenizerAndRejectsAMismatch) {
  const auto dir = std::filesystem::temp_directory_path() / "hl_ckpt_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.safetensors").string();
  model::GPTConfig c = tiny();
  c.vocab_size = 300;
  model::GPT m(c, 2);
  const auto tok = model::Tokenizer::train_bpe("abab abab cdcd cdcd abab", 260);
  save_model(path, m, &tok);
  const LoadedModel l = load_model(path);
  ASSERT_TRUE(l.tokenizer.has_value());
  EXPECT_EQ(l.tokenizer->encode("abab cdcd"), tok.encode("abab cdcd"));
  model::GPTConfig small = tiny();
  small.vocab_size = 100;
  model::GPT s(small, 2);
  testing::expect_error([&] { save_model(path, s, &tok); }, {"more than the model's vocab_size"});
  // The failed save left the earlier checkpoint intact.
  EXPECT_EQ(load_model(path).model.config().vocab_size, 300);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace headlight::train

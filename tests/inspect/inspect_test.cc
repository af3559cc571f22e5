// Head roles on constructed attention patterns with known answers, importance of a gated-off head,
// pruning against gating, words and the capture's exports.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "headlight/inspect/analysis.h"
#include "headlight/inspect/capture.h"
#include "headlight/inspect/importance.h"
#include "headlight/inspect/roles.h"
#include "test_util.h"

namespace headlight::inspect {
namespace {

// A causal pattern: row i puts all its weight on key f(i).
template <typename F>
std::vector<float> pattern(int64_t T, F f) {
  std::vector<float> p(static_cast<size_t>(T * T), 0.0f);
  for (int64_t i = 0; i < T; ++i) p[static_cast<size_t>(i * T + f(i))] = 1.0f;
  return p;
}

TEST(Roles, ScoresOnConstructedPatterns) {
  const int64_t T = 20;
  RoleScores prev, first, self, uniform;
  text_scores(pattern(T, [](int64_t i) { return i > 0 ? i - 1 : 0; }).data(), T, prev);
  text_scores(pattern(T, [](int64_t) { return int64_t{0}; }).data(), T, first);
  text_scores(pattern(T, [](int64_t i) { return i; }).data(), T, self);
  std::vector<float> u(T * T, 0.0f);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) u[i * T + j] = 1.0f / static_cast<float>(i + 1);
  text_scores(u.data(), T, uniform);
  EXPECT_DOUBLE_EQ(prev.previous_token, 1.0);
  EXPECT_EQ(role_of(prev), "previous_token");
  EXPECT_DOUBLE_EQ(first.first_token, 1.0);
  EXPECT_EQ(role_of(first), "first_token");
  EXPECT_DOUBLE_EQ(self.self, 1.0);
  EXPECT_DOUBLE_EQ(self.local, 1.0);
  EXPECT_EQ(role_of(self), "local");
  EXPECT_NEAR(uniform.local, 0.0, 1e-6);
  EXPECT_LT(uniform.previous_token, 0.2);
  EXPECT_EQ(role_of(uniform), "mixed");

  // Induction: n tokens repeated; the second copy's row n + k looks at k + 1.
  const int64_t n = 10;
  const auto ind = pattern(2 * n, [&](int64_t i) { return i >= n ? i - n + 1 : 0; });
  EXPECT_DOUBLE_EQ(induction_score(ind.data(), n), 1.0);
  EXPECT_DOUBLE_EQ(induction_score(pattern(2 * n, [](int64_t i) { return i; }).data(), n), 0.0);

  // Coreference: the pronoun's row split over mentions.
  std::vector<float> p(T * T, 0.0f);
  p[15 * T + 2] = 0.3f;  // mention 0: tokens 2..3
  p[15 * T + 3] = 0.3f;
  p[15 * T + 8] = 0.4f;  // mention 1: token 8
  EXPECT_EQ(most_attended_mention(p.data(), T, 15, {{2, 3}, {8, 8}}), 0);
  EXPECT_EQ(most_attended_mention(p.data(), T, 15, {{2, 2}, {8, 8}}), 1);
}

TEST(Capture, FromProbabilitiesComputedElsewhereWithItsHeadTable) {
  // Two layers × two heads over n = 6 tokens repeated twice: an induction head, a previous-token
  // head, a first-token head and a self head, as a PyTorch model's capture would bring them.
  const int64_t n = 6, T = 2 * n;
  const std::vector<std::vector<float>> heads = {
      pattern(T, [&](int64_t i) { return i >= n ? i - n + 1 : 0; }),
      pattern(T, [](int64_t i) { return i > 0 ? i - 1 : 0; }),
      pattern(T, [](int64_t) { return int64_t{0}; }), pattern(T, [](int64_t i) { return i; })};
  std::vector<float> probs;
  for (const auto& h : heads) probs.insert(probs.end(), h.begin(), h.end());
  std::vector<std::string> text;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < T; ++i) {
    text.push_back(" w" + std::to_string(i % n));
    ids.push_back(static_cast<int32_t>(i % n));
  }
  const Capture c = capture_from_probs(ids, text, 2, 2, probs);
  EXPECT_EQ(c.words.size(), static_cast<size_t>(T));
  ASSERT_EQ(c.stats.size(), 4u);
  EXPECT_DOUBLE_EQ(c.stats[1].mean_distance, static_cast<double>(T - 1) / T);
  // Scored as a repeated sequence: induction and previous token are measured.
  auto rows = capture_head_table(c, /*causal=*/true, n);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].role, "induction");
  EXPECT_DOUBLE_EQ(rows[0].scores.induction, 1.0);
  EXPECT_EQ(rows[1].role, "previous_token");
  EXPECT_EQ(rows[2].role, "first_token");
  EXPECT_EQ(rows[3].role, "local");
  EXPECT_TRUE(std::isnan(rows[0].importance) && std::isnan(rows[0].scores.coreference));
  // As one text: what it cannot give is NaN (null in JSON), and the roles come from the rest.
  rows = capture_head_table(c, true);
  EXPECT_TRUE(std::isnan(rows[0].scores.induction) && std::isnan(rows[1].scores.previous_token));
  EXPECT_DOUBLE_EQ(rows[1].scores.previous_token_text, 1.0);
  EXPECT_EQ(rows[1].role, "local");  // a previous-token rule needs random tokens to be told apart
  EXPECT_EQ(rows[2].role, "first_token");
  EXPECT_NE(head_table_json(rows).find("\"induction\":null"), std::string::npos);
  // Sizes that disagree are named.
  headlight::testing::expect_error([&] { capture_from_probs(ids, text, 2, 3, probs); },
                                   {"probs", "n_head 3"});
  headlight::testing::expect_error(
      [&] {
        capture_from_probs({1, 2}, text, 2, 2, probs);
      },
      {"tokens", "2 ids for 12"});
  headlight::testing::expect_error([&] { capture_head_table(c, true, 5); }, {"repeated", "12"});
}

TEST(Capture, WordsStatsAndNpy) {
  const std::vector<std::string> toks = {"Maria", " found", " a", " re", "d",
                                         " key",  ".",      "\n", "Then"};
  const auto words = split_words(toks);
  ASSERT_EQ(words.size(), 6u);
  EXPECT_EQ(words[3].text, "red");
  EXPECT_EQ(words[3].first, 3);
  EXPECT_EQ(words[3].last, 4);
  EXPECT_EQ(words[5].text, "Then");
  // WordPiece's readable pieces: [CLS] and [SEP] stand alone, "##" pieces join their word.
  const auto bert = split_words({"[CLS]", " un", "bel", "ievably", " ,", " maria", ".", "[SEP]"});
  ASSERT_EQ(bert.size(), 5u);
  EXPECT_EQ(bert[0].text, "[CLS]");
  EXPECT_EQ(bert[1].text, "unbelievably");
  EXPECT_EQ(bert[3].text, "maria.");
  EXPECT_EQ(bert[4].text, "[SEP]");
  const auto s = head_stats(pattern(4, [](int64_t i) { return int64_t{0}; }).data(), 4);
  EXPECT_DOUBLE_EQ(s.first_token, 1.0);
  EXPECT_DOUBLE_EQ(s.mean_distance, 1.5);
  EXPECT_DOUBLE_EQ(s.entropy, 0.0);
  const std::string path = (std::filesystem::temp_directory_path() / "hl_test.npy").string();
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  AtomicFile out(path);
  write_npy(out, data.data(), {2, 3});
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  EXPECT_NE(bytes.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(bytes.size() % 64, 24u);  // a 64-byte aligned header, then 24 bytes of data
  float last;
  std::memcpy(&last, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(last, 6.0f);
  std::filesystem::remove(path);
}

TEST(Capture, WordViewSumsKeysAndAveragesQueries) {
  // Tokens "a", " b", "c", " d": words "a" = {0}, "bc" = {1, 2}, "d" = {3}.
  Capture c;
  c.token_text = {"a", " b", "c", " d"};
  c.words = split_words(c.token_text);
  c.n_layer = c.n_head = 1;
  c.seq = 4;
  c.probs = {1.0f, 0,    0,    0,  //
             0.5f, 0.5f, 0,    0,  //
             0.2f, 0.3f, 0.5f, 0,  //
             0.1f, 0.2f, 0.3f, 0.4f};
  ASSERT_EQ(c.words.size(), 3u);
  const auto w = word_attention(c);
  ASSERT_EQ(w.size(), 9u);
  // Row "bc": the mean of token rows 1 and 2, keys of "bc" summed: (0.5 + 0.5 + 0.3)/2 … .
  EXPECT_NEAR(w[3 + 0], (0.5 + 0.2) / 2, 1e-6);
  EXPECT_NEAR(w[3 + 1], (0.5 + 0.3 + 0.5) / 2, 1e-6);
  EXPECT_NEAR(w[3 + 2], 0.0, 1e-6);
  EXPECT_NEAR(w[6 + 1], 0.2 + 0.3, 1e-6);
  for (int a = 0; a < 3; ++a) EXPECT_NEAR(w[a * 3] + w[a * 3 + 1] + w[a * 3 + 2], 1.0, 1e-6);
}

model::GPTConfig config() {
  return {
      .vocab_size = 41, .n_layer = 2, .n_head = 4, .n_kv_head = 4, .n_embd = 32, .block_size = 32};
}

std::vector<int32_t> data(int64_t n) {
  Generator g(3);
  std::vector<int32_t> d(static_cast<size_t>(n));
  for (auto& t : d) t = static_cast<int32_t>(g.next_u32() % 41);
  return d;
}

TEST(Importance, AGatedOffHeadScoresZero) {
  model::GPT m(config(), 1);
  ThreadContext ctx(2);
  const Dataset d = make_dataset(data(600), m.config(), 32, 8);
  m.gates().at(1, 1) = 0.0f;
  const auto grad = gradient_importance(ctx, m, d);
  const auto abl = ablation_importance(ctx, m, d);
  EXPECT_EQ(grad[5], 0.0);
  EXPECT_EQ(abl[5], 0.0);
  for (size_t i = 0; i < grad.size(); ++i) {
    if (i != 5) {
      EXPECT_GT(grad[i], 0.0) << i;
    }
  }
  // Normalised per layer.
  double norm = 0;
  for (int h = 0; h < 4; ++h) norm += grad[h] * grad[h];
  EXPECT_NEAR(norm, 1.0, 1e-9);
}

TEST(Prune, ThePrunedModelComputesWhatTheGatedModelComputes) {
  model::GPT m(config(), 2);
  ThreadContext ctx(2);
  const std::vector<HeadId> remove = {{0, 1}, {1, 0}, {1, 3}};
  const auto tokens = data(32);
  model::GPT small = prune_heads(m, remove);
  EXPECT_EQ(small.config().heads(0), 3);
  EXPECT_EQ(small.config().heads(1), 2);
  EXPECT_LT(small.layout().total(), m.layout().total());
  for (const auto& [l, h] : remove) m.gates().at(l, h) = 0.0f;
  const float* a = m.forward(ctx, tokens.data(), 1, 32);
  std::vector<float> want(a, a + 32 * 41);
  const float* b = small.forward(ctx, tokens.data(), 1, 32);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(b[i], want[i], 1e-5) << i;
  // A layer may lose every head; the model still runs and trains.
  model::GPT empty = prune_heads(m, {{0, 0}, {0, 1}, {0, 2}, {0, 3}});
  EXPECT_EQ(empty.config().heads(0), 0);
  const auto targets = data(32);
  EXPECT_TRUE(std::isfinite(empty.forward_backward(ctx, tokens.data(), targets.data(), 1, 32)));
  testing::expect_error([&] { prune_heads(m, {{2, 0}}); }, {"heads: (2, 0)"});
  // A model whose products run in bf16 is pruned into one that does too: the same logits as the
  // gated bf16 model (bits apart only where a product's reduction order differs).
  m.set_dtype(DType::bf16);
  model::GPT small16 = prune_heads(m, remove);
  EXPECT_EQ(small16.dtype(), DType::bf16);
  EXPECT_EQ(small.dtype(), DType::f32);
  const float* a16 = m.forward(ctx, tokens.data(), 1, 32);
  std::vector<float> want16(a16, a16 + 32 * 41);
  const float* b16 = small16.forward(ctx, tokens.data(), 1, 32);
  double off32 = 0, off16 = 0;
  for (size_t i = 0; i < want16.size(); ++i) {
    off16 = std::max(off16, static_cast<double>(std::fabs(b16[i] - want16[i])));
    off32 = std::max(off32, static_cast<double>(std::fabs(want16[i] - want[i])));
  }
  EXPECT_LT(off16, 1e-5);  // the pruned bf16 model computes the gated bf16 model's logits
  EXPECT_GT(off32, 1e-4);  // and not the float32 ones
}

TEST(Prune, GroupedQueryHeadsLeaveUnequalGroupsThatComputeWhatTheGatesDo) {
  // Six query heads over two key/value heads (groups of three), rotary positions, no biases.
  const model::GPTConfig c{.vocab_size = 41,
                           .n_layer = 2,
                           .n_head = 6,
                           .n_kv_head = 2,
                           .n_embd = 48,
                           .block_size = 32,
                           .positional = model::Positional::rope,
                           .norm = model::Norm::rmsnorm,
                           .bias = false};
  model::GPT m(c, 4);
  ThreadContext ctx(2);
  // Layer 0 keeps groups of 2 and 3; layer 1 loses its second key/value head with its last query
  // head, keeping one group of 2.
  const std::vector<HeadId> remove = {{0, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}};
  model::GPT small = prune_heads(m, remove);
  EXPECT_EQ(small.config().layer_groups, (std::vector<std::vector<int64_t>>{{2, 3}, {2}}));
  EXPECT_EQ(small.config().kv_heads(1), 1);
  EXPECT_EQ(small.config().qkv_width(1), (2 + 2) * 8);
  for (const auto& [l, h] : remove) m.gates().at(l, h) = 0.0f;
  const auto tokens = data(32), targets = data(33);
  const float* a = m.forward(ctx, tokens.data(), 1, 32);
  const std::vector<float> want(a, a + 32 * 41);
  const float* b = small.forward(ctx, tokens.data(), 1, 32);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(b[i], want[i], 1e-5) << i;
  // Gradients: those of the weights both models share (the embeddings) agree.
  m.zero_grads();
  small.zero_grads();
  const double la = m.forward_backward(ctx, tokens.data(), targets.data() + 1, 1, 32);
  const double lb = small.forward_backward(ctx, tokens.data(), targets.data() + 1, 1, 32);
  EXPECT_NEAR(la, lb, 1e-5);
  const int64_t wte = m.layout().at("transformer.wte.weight").numel;
  for (int64_t i = 0; i < wte; ++i) ASSERT_NEAR(small.grads()[i], m.grads()[i], 1e-5) << i;
  // Decoding token by token through the KV cache gives the forward's rows.
  small.reset_cache();
  for (int64_t t = 0; t < 32; ++t) {
    const float* row = small.decode(ctx, tokens.data() + t, 1);
    for (int64_t v = 0; v < 41; ++v)
      ASSERT_NEAR(row[v], want[static_cast<size_t>(t * 41 + v)], 1e-4) << t << " " << v;
  }
  // The groups survive a checkpoint's JSON and a second pruning.
  EXPECT_EQ(model::config_from_json(model::to_json(small.config())).layer_groups,
            small.config().layer_groups);
  model::GPT smaller = prune_heads(small, {{0, 0}, {0, 1}});
  EXPECT_EQ(smaller.config().layer_groups, (std::vector<std::vector<int64_t>>{{3}, {2}}));
  model::GPTConfig bad = small.config();
  bad.layer_groups[0] = {1, 3};
  testing::expect_error([&] { model::validate(bad); }, {"layer_groups: layer 0"});
}

TEST(Prune, CurveCoversEveryFractionAndMethod) {
  model::GPT m(config(), 2);
  ThreadContext ctx(2);
  const Dataset d = make_dataset(data(600), m.config(), 32, 4);
  const auto gates = m.gates().snapshot();
  const auto curve = pruning_curve(ctx, m, d, d, {.random_seeds = 2});
  ASSERT_EQ(curve.size(), 27u);
  for (size_t i = 0; i < curve.size(); ++i) {
    EXPECT_NEAR(curve[i].fraction, 0.1 * static_cast<double>(i / 3 + 1), 1e-12);
    EXPECT_EQ(curve[i].method,
              (std::vector<std::string>{"importance", "ablation", "random"}[i % 3]));
    EXPECT_TRUE(std::isfinite(curve[i].loss));
  }
  EXPECT_EQ(m.gates().snapshot(), gates);  // the model is left as it was
  // Chosen fractions and methods, judged on other data: random is the mean of its seeds.
  const Dataset held_out = make_dataset(data(900), m.config(), 32, 4);
  const auto some = pruning_curve(ctx, m, d, held_out,
                                  {.fractions = {0.25, 0.5},
                                   .methods = {PruneBy::random, PruneBy::importance},
                                   .random_seeds = 3});
  ASSERT_EQ(some.size(), 4u);
  EXPECT_EQ(some[0].method, "random");
  EXPECT_EQ(some[1].method, "importance");
  EXPECT_EQ(some[3].fraction, 0.5);
  double sum = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    model::GPT pruned = prune_heads(m, heads_to_remove(m.config(), {}, 2, seed));
    sum += dataset_loss(ctx, pruned, held_out);
  }
  EXPECT_NEAR(some[0].loss, sum / 3, 1e-5);
  testing::expect_error(
      [&] {
        pruning_curve(ctx, m, d, d, {.fractions = {0.5, 0.2}});
      },
      {"fractions: 0.2"});
}

TEST(Prune, HeadsToRemoveFollowsScoresOrSeed) {
  const auto c = config();
  std::vector<double> s = {0.5, 0.1, 0.9, 0.3, 0.2, 0.8, 0.7, 0.05};
  const auto r = heads_to_remove(c, s, 3, 0);
  EXPECT_EQ(r, (std::vector<HeadId>{{1, 3}, {0, 1}, {1, 0}}));
  EXPECT_EQ(heads_to_remove(c, {}, 4, 7), heads_to_remove(c, {}, 4, 7));
  EXPECT_NE(heads_to_remove(c, {}, 4, 7), heads_to_remove(c, {}, 4, 8));
}

TEST(Sweep, OneTrainedModelPerHeadCountWithItsScores) {
  ThreadContext ctx(2);
  model::GPTConfig base = config();
  base.block_size = 64;
  SweepOptions so;
  so.heads = {1, 4};
  so.stories = 60;
  so.shape.signatures = true;
  so.train.steps = 3;
  so.train.batch = 2;
  so.train.eval_every = 3;
  so.train.eval_batches = 1;
  const model::Tokenizer tok = model::Tokenizer::byte_level();
  const auto rows = head_sweep(ctx, base, tok, so);
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].heads, so.heads[i]);
    EXPECT_TRUE(std::isfinite(rows[i].val_loss) && rows[i].val_loss > 0);
    EXPECT_GT(rows[i].tokens_per_second, 0);
    for (double x : {rows[i].best.previous_token, rows[i].best.induction, rows[i].best.coreference,
                     rows[i].best.local}) {
      EXPECT_GE(x, 0.0);
      EXPECT_LE(x, 1.0);
    }
  }
  so.heads = {3};  // 32 is not divisible by 3
  testing::expect_error([&] { head_sweep(ctx, base, tok, so); }, {"heads", "3"});
}

}  // namespace
}  // namespace headlight::inspect

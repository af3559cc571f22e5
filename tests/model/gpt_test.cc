// GPT: loading from a TensorSource (every kind of bad checkpoint content), determinism across
// thread counts, KV-cache decoding against the full forward, dropout, and tokenizers.

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "headlight/model/gpt.h"
#include "headlight/model/sampling.h"
#include "headlight/model/tokenizer.h"
#include "test_util.h"

namespace headlight::model {
namespace {

using testing::expect_error;

// Weights from memory, as a test double for a checkpoint file.
class MapSource : public TensorSource {
 public:
  std::map<std::string, std::pair<Shape, std::vector<float>>> tensors;
  std::map<std::string, std::string> meta;
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [k, v] : tensors) out.push_back(k);
    return out;
  }
  bool contains(const std::string& n) const override { return tensors.count(n) > 0; }
  Shape shape(const std::string& n) const override { return tensors.at(n).first; }
  void read_f32(const std::string& n, float* dst) const override {
    const auto& v = tensors.at(n).second;
    std::memcpy(dst, v.data(), v.size() * sizeof(float));
  }
  std::string stored_dtype(const std::string&) const override { return "F32"; }
  std::optional<std::string> metadata(const std::string& k) const override {
    const auto it = meta.find(k);
    if (it == meta.end()) return std::nullopt;
    return it->second;
  }
};

GPTConfig small_config() {
  return {.vocab_size = 37,
          .n_layer = 2,
          .n_head = 4,
          .n_kv_head = 2,
          .n_embd = 32,
          .block_size = 24,
          .positional = Positional::rope};
}

MapSource source_of(const GPT& m) {
  MapSource s;
  for (const auto& e : m.layout().entries())
    s.tensors[e.name] = {
        e.shape, std::vector<float>(m.params() + e.offset, m.params() + e.offset + e.numel)};
  s.meta["headlight.config"] = to_json(m.config());
  return s;
}

std::vector<int32_t> tokens_for(int64_t n, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g.next_u32() % static_cast<uint32_t>(vocab));
  return t;
}

TEST(GPT, LoadsItsOwnWeights) {
  GPT a(small_config(), 1);
  const MapSource s = source_of(a);
  GPT b(s);
  EXPECT_EQ(std::memcmp(a.params(), b.params(), sizeof(float) * a.layout().total()), 0);
}

TEST(GPT, RejectsBadCheckpointContents) {
  GPT a(small_config(), 1);
  {
    MapSource s = source_of(a);
    s.tensors.erase("transformer.h.1.mlp.c_fc.weight");
    expect_error([&] { GPT m(s); }, {"missing tensor \"transformer.h.1.mlp.c_fc.weight\""});
  }
  {
    MapSource s = source_of(a);
    s.tensors["transformer.h.9.extra"] = {{1}, {0.0f}};
    expect_error([&] { GPT m(s); }, {"unexpected tensor \"transformer.h.9.extra\""});
  }
  {
    MapSource s = source_of(a);
    s.tensors["lm_head.weight"] = {{37, 32}, std::vector<float>(37 * 32)};
    expect_error([&] { GPT m(s); }, {"unexpected tensor \"lm_head.weight\"", "tied"});
  }
  {
    MapSource s = source_of(a);
    s.tensors["transformer.wte.weight"].first = {32, 37};
    expect_error([&] { GPT m(s); }, {"transformer.wte.weight", "[32, 37]", "[37, 32]"});
  }
  {
    MapSource s = source_of(a);
    s.meta.clear();
    expect_error([&] { GPT m(s); }, {"missing \"headlight.config\""});
  }
  {
    MapSource s = source_of(a);
    GPTConfig bad = small_config();
    s.meta["headlight.config"] = to_json(bad);
    s.meta["headlight.config"].replace(s.meta["headlight.config"].find("\"n_embd\":32"), 11,
                                       "\"n_embd\":30");
    expect_error([&] { GPT m(s); }, {"n_embd: 30 is not divisible by n_head 4"});
  }
  {
    MapSource s = source_of(a);
    s.meta["headlight.config"] = "{\"vocab_size\": 37";
    expect_error([&] { GPT m(s); }, {"headlight.config", "not valid JSON"});
  }
  {
    MapSource s = source_of(a);
    s.meta["headlight.config"] = R"({"vocab_size": 37, "n_layer": 2})";
    expect_error([&] { GPT m(s); }, {"missing \"n_head\""});
  }
  {
    MapSource s = source_of(a);
    s.meta["headlight.config"] =
        R"({"vocab_size":37,"n_layer":2,"n_head":4,"n_kv_head":3,"n_embd":32,"block_size":24})";
    expect_error([&] { GPT m(s); }, {"n_kv_head: 3"});
  }
}

TEST(GPT, GradientsAreMadeOnFirstUseAndReadAsZerosBefore) {
  // A model only run forward (generation, embeddings, head reports) holds no gradient arena; the
  // gradients read as zeros until a backward fills them, through either accessor, and zero_grads
  // before any exists is allowed.
  GPT m(small_config(), 3);
  ThreadContext ctx(2);
  const auto t = tokens_for(2 * 8, m.config().vocab_size, 4);
  m.zero_grads();
  ForwardOptions o;
  o.inference = true;
  m.forward(ctx, t.data(), 2, 8, o);
  const GPT& cm = m;
  const int64_t n = m.layout().total();
  EXPECT_TRUE(std::all_of(cm.grads(), cm.grads() + n, [](float g) { return g == 0.0f; }));
  std::vector<int32_t> targets(t.begin() + 1, t.end());
  targets.push_back(0);
  m.forward_backward(ctx, t.data(), targets.data(), 2, 8);
  EXPECT_TRUE(std::any_of(cm.grads(), cm.grads() + n, [](float g) { return g != 0.0f; }));
  EXPECT_EQ(m.grad("transformer.wte.weight"),
            m.grads() + m.layout().at("transformer.wte.weight").offset);
  m.zero_grads();
  EXPECT_TRUE(std::all_of(m.grads(), m.grads() + n, [](float g) { return g == 0.0f; }));
}

TEST(GPT, TrainingStepIsBitwiseTheSameForAnyThreadCount) {
  GPTConfig c = small_config();
  c.dropout = 0.1f;
  const auto x = tokens_for(3 * 24, c.vocab_size, 5), y = tokens_for(3 * 24, c.vocab_size, 6);
  ForwardOptions o;
  o.train = true;
  o.seed = 99;
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (int threads : {1, 2, 3}) {
    GPT m(c, 3);
    ThreadContext ctx(threads);
    losses.push_back(m.forward_backward(ctx, x.data(), y.data(), 3, 24, o));
    grads.emplace_back(m.grads(), m.grads() + m.layout().total());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
}

TEST(GPT, DropoutIsSeededAndOffInEvaluation) {
  GPTConfig c = small_config();
  c.dropout = 0.2f;
  GPT m(c, 3);
  ThreadContext ctx(2);
  const auto x = tokens_for(24, c.vocab_size, 5), y = tokens_for(24, c.vocab_size, 6);
  ForwardOptions train;
  train.train = true;
  train.seed = 1;
  const double a = m.loss(ctx, x.data(), y.data(), 1, 24, train);
  const double b = m.loss(ctx, x.data(), y.data(), 1, 24, train);
  train.seed = 2;
  const double other = m.loss(ctx, x.data(), y.data(), 1, 24, train);
  const double eval1 = m.loss(ctx, x.data(), y.data(), 1, 24);
  const double eval2 = m.loss(ctx, x.data(), y.data(), 1, 24);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  EXPECT_NE(a, eval1);
  EXPECT_EQ(eval1, eval2);
}

TEST(GPT, CachedDecodingMatchesTheFullForward) {
  for (Positional pos : {Positional::learned, Positional::rope, Positional::alibi,
                         Positional::sinusoidal, Positional::none}) {
    GPTConfig c = small_config();
    c.positional = pos;
    GPT m(c, 7);
    ThreadContext ctx(2);
    const auto t = tokens_for(20, c.vocab_size, 8);
    const float* full = m.forward(ctx, t.data(), 1, 20);
    std::vector<float> want(full, full + 20 * c.vocab_size);
    m.reset_cache();
    m.decode(ctx, t.data(), 11);  // a prompt of 11, then one token at a time
    for (int64_t i = 11; i < 20; ++i) {
      const float* got = m.decode(ctx, t.data() + i, 1);
      for (int64_t v = 0; v < c.vocab_size; ++v)
        ASSERT_NEAR(got[v], want[static_cast<size_t>(i * c.vocab_size + v)], 2e-5)
            << positional_name(pos) << " position " << i;
    }
    EXPECT_EQ(m.cache_length(), 20);
    expect_error([&] { m.decode(ctx, t.data(), 5); }, {"block_size 24"});
  }
}

// An inference forward (the activation fused into its product) gives the same outputs within
// rounding for every activation, and a backward after it is refused.
TEST(GPT, InferenceForwardMatchesAndRefusesABackward) {
  for (ops::Activation act : {ops::Activation::gelu_tanh, ops::Activation::gelu_erf,
                              ops::Activation::relu, ops::Activation::swiglu}) {
    GPTConfig c = small_config();
    c.activation = act;
    c.n_layer = 5;  // the inference forward's shared buffers in turn, both norm placements
    c.norm_first = act != ops::Activation::relu;
    c.n_embd = 128;       // 32 rows · 128 · 1040 multiply-adds: oneDNN's primitive and its
    c.mlp_hidden = 1040;  // epilogue, not the small-product path
    GPT m(c, 3);
    ThreadContext ctx(2);
    const auto t = tokens_for(2 * 16, c.vocab_size, 4);
    const float* out = m.forward(ctx, t.data(), 2, 16);
    std::vector<float> want(out, out + 2 * 16 * c.vocab_size);
    ForwardOptions o;
    o.inference = true;
    const float* got = m.forward(ctx, t.data(), 2, 16, o);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-5) << ops::activation_name(act) << " " << i;
    std::vector<float> dout(want.size(), 1.0f);
    expect_error([&] { m.backward(ctx, t.data(), dout.data(), o); }, {"for inference"});
    // A training forward after it still gives the same outputs and a backward.
    const float* again = m.forward(ctx, t.data(), 2, 16);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(again[i], want[i]) << i;
    m.backward(ctx, t.data(), dout.data());
  }
}

TEST(GPT, Bf16ProductsTrackTheFloat32WeightsAndTrainInMixedPrecision) {
  // bf16 products (set_dtype): every product's inputs rounded to bf16, so the logits move by about
  // 2⁻⁸ of their size; the copies of the weights (packed for inference, the arena's for training)
  // follow changes made through param(); a training step's loss and gradients stay near
  // float32's; decoding with the cache equals the full forward.
  GPTConfig c = small_config();
  c.n_embd = 128;
  c.mlp_hidden = 512;
  c.tied_embeddings = false;  // an output row to change alone
  GPT m(c, 5);
  ThreadContext ctx(2);
  const auto t = tokens_for(2 * 16, c.vocab_size, 6);
  ForwardOptions o;
  o.inference = true;
  const float* out = m.forward(ctx, t.data(), 2, 16, o);
  const std::vector<float> f32(out, out + 2 * 16 * c.vocab_size);
  m.set_dtype(DType::bf16);
  out = m.forward(ctx, t.data(), 2, 16, o);
  const std::vector<float> b16(out, out + f32.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    scale = std::max(scale, double(std::fabs(f32[i])));
    diff = std::max(diff, double(std::fabs(f32[i] - b16[i])));
  }
  EXPECT_GT(diff, 0.0);  // bf16 products did run
  EXPECT_LT(diff, 0.03 * scale);
  // An inference forward reads each weight packed for oneDNN, a forward that keeps activations
  // for a backward the bf16 copy of the arena: the same values, so the same logits up to the
  // products' summation order.
  const float* kept = m.forward(ctx, t.data(), 2, 16, ForwardOptions{});
  for (size_t i = 0; i < f32.size(); ++i) ASSERT_NEAR(kept[i], b16[i], 1e-5 * scale) << i;
  // A change to the weights through param() reaches the bf16 products (packed or not).
  float* w = m.param("lm_head.weight");
  for (int64_t i = 0; i < c.n_embd; ++i) w[i] *= 2.0f;  // token 0's output row
  out = m.forward(ctx, t.data(), 2, 16, o);
  EXPECT_NE(out[0], b16[0]);
  EXPECT_EQ(out[1], b16[1]);
  out = m.forward(ctx, t.data(), 2, 16, ForwardOptions{});
  EXPECT_NE(out[0], b16[0]);
  EXPECT_NEAR(out[1], b16[1], 1e-5 * scale);
  // Mixed-precision training: the loss and every gradient near float32's.
  std::vector<int32_t> targets(t.begin() + 1, t.end());
  targets.push_back(0);
  m.zero_grads();
  const double loss16 = m.forward_backward(ctx, t.data(), targets.data(), 2, 16);
  const std::vector<float> g16(m.grads(), m.grads() + m.layout().total());
  m.set_dtype(DType::f32);
  m.zero_grads();
  const double loss32 = m.forward_backward(ctx, t.data(), targets.data(), 2, 16);
  EXPECT_NEAR(loss16, loss32, 0.01 * loss32);
  double gmax = 0, gdiff = 0;
  for (int64_t i = 0; i < m.layout().total(); ++i) {
    gmax = std::max(gmax, double(std::fabs(m.grads()[i])));
    gdiff = std::max(gdiff, double(std::fabs(m.grads()[i] - g16[static_cast<size_t>(i)])));
  }
  EXPECT_GT(gdiff, 0.0);
  EXPECT_LT(gdiff, 0.03 * gmax);
  m.set_dtype(DType::bf16);
  // Decoding (KV cache) in bf16 follows the bf16 full forward's last row: the products are the
  // same; decoding's attention reads q, k, v rounded to bf16 (the cache is bf16) and the short
  // full forward's reads them in fp32, so they differ by that rounding (about 2⁻⁸ of the size).
  const float* full = m.forward(ctx, t.data(), 1, 16, o);
  const std::vector<float> last(full + 15 * c.vocab_size, full + 16 * c.vocab_size);
  double size = 0;
  for (float x : last) size = std::max(size, double(std::fabs(x)));
  m.reset_cache();
  const float* dec = m.decode(ctx, t.data(), 16);
  for (int64_t v = 0; v < c.vocab_size; ++v) EXPECT_NEAR(dec[v], last[v], 0.02 * size) << v;
  m.set_dtype(DType::f32);
  out = m.forward(ctx, t.data(), 2, 16);  // float32 again: training forwards allowed
  EXPECT_TRUE(std::isfinite(out[0]));
}

TEST(GPT, Bf16AttentionFromRoundedProductsTrainsAndShowsItsHeads) {
  // From 128 rows a bf16 model attends q, k, v rounded to bf16; without RoPE the q/k/v product
  // writes them only rounded (the float32 qkv rows stay unwritten). Training then tracks float32
  // (loss within 1%, every gradient within 3% of the largest), and head_attention shows the rows
  // the forward attended, not stale float32 ones: an fp32 forward of other tokens first leaves
  // its qkv in the buffer, and the bf16 forward's heads must still match fp32's on the same tokens
  // (within bf16 rounding), not those other tokens'.
  GPTConfig c = small_config();
  c.positional = Positional::learned;
  c.block_size = 128;
  c.n_embd = 64;
  GPT m(c, 21);
  ThreadContext ctx(2);
  const int64_t T = 128;
  const auto t = tokens_for(T, c.vocab_size, 22), other = tokens_for(T, c.vocab_size, 23);
  std::vector<int32_t> targets(t.begin() + 1, t.end());
  targets.push_back(0);
  m.zero_grads();
  const double loss32 = m.forward_backward(ctx, t.data(), targets.data(), 1, T);
  const std::vector<float> g32(m.grads(), m.grads() + m.layout().total());
  m.set_dtype(DType::bf16);
  m.zero_grads();
  const double loss16 = m.forward_backward(ctx, t.data(), targets.data(), 1, T);
  EXPECT_NEAR(loss16, loss32, 0.01 * loss32);
  double gmax = 0, gdiff = 0;
  for (int64_t i = 0; i < m.layout().total(); ++i) {
    gmax = std::max(gmax, double(std::fabs(g32[static_cast<size_t>(i)])));
    gdiff = std::max(gdiff, double(std::fabs(m.grads()[i] - g32[static_cast<size_t>(i)])));
  }
  EXPECT_GT(gdiff, 0.0);
  EXPECT_LT(gdiff, 0.03 * gmax);
  ForwardOptions o;
  o.inference = false;  // a training forward keeps every layer's rows
  std::vector<float> want(static_cast<size_t>(T * T)), got(want.size()), stale(want.size());
  m.set_dtype(DType::f32);
  m.forward(ctx, other.data(), 1, T, o);
  m.head_attention(ctx, 1, 2, stale.data());
  m.forward(ctx, t.data(), 1, T, o);
  m.head_attention(ctx, 1, 2, want.data());
  m.forward(ctx, other.data(), 1, T, o);  // the float32 rows of `other` left in the buffer
  m.set_dtype(DType::bf16);
  m.forward(ctx, t.data(), 1, T, o);
  m.head_attention(ctx, 1, 2, got.data());
  double diff = 0, apart = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, double(std::fabs(got[i] - want[i])));
    apart = std::max(apart, double(std::fabs(stale[i] - want[i])));
  }
  EXPECT_GT(apart, 5e-3);       // the two token streams' heads differ (here by 0.016)
  EXPECT_LT(diff, apart / 20);  // the bf16 forward's heads are its own tokens' (here 6·10⁻⁵)
  m.set_dtype(DType::f32);
}

TEST(GPT, Bf16DecodingKeepsTheKVCacheInBf16) {
  // At 512 rows the full bf16 forward's attention reads q, k, v rounded to bf16, as decoding's
  // does from its bf16 cache: a prefill of the same tokens through the cache gives the same last
  // row (to the products' summation order; an fp32 cache would differ by ≈ 2⁻⁸ of the size). The
  // next token then decodes from that cache as the full forward of 513 tokens computes it.
  GPTConfig c = small_config();
  c.block_size = 600;
  c.n_embd = 64;
  GPT m(c, 8);
  m.set_dtype(DType::bf16);
  ThreadContext ctx(2);
  const auto t = tokens_for(513, c.vocab_size, 9);
  ForwardOptions o;
  o.inference = true;
  auto last_row = [&](int64_t n) {
    const float* full = m.forward(ctx, t.data(), 1, n, o);
    return std::vector<float>(full + (n - 1) * c.vocab_size, full + n * c.vocab_size);
  };
  const std::vector<float> want512 = last_row(512), want513 = last_row(513);
  double size = 0;
  for (float x : want512) size = std::max(size, double(std::fabs(x)));
  m.reset_cache();
  const float* dec = m.decode(ctx, t.data(), 512);
  for (int64_t v = 0; v < c.vocab_size; ++v) EXPECT_NEAR(dec[v], want512[v], 2e-5 * size) << v;
  dec = m.decode(ctx, t.data() + 512, 1);
  for (int64_t v = 0; v < c.vocab_size; ++v) EXPECT_NEAR(dec[v], want513[v], 1e-2 * size) << v;
  // A change of dtype empties the cache (it is kept in the products' dtype).
  EXPECT_EQ(m.cache_length(), 513);
  m.set_dtype(DType::f32);
  EXPECT_EQ(m.cache_length(), 0);
}

TEST(GPT, Bf16DecodingFromTheBlockedCacheFollowsTheFullForward) {
  // With a head dim that is a multiple of 32 the bf16 cache lies in decode's blocked layout
  // (attention/kv_layout.h): a prefill of 250 tokens (read through a row copy), then one token at
  // a time past the first chunk of 256 positions, where the cache grows from 256 to 512 and each
  // head's region is copied; every step's logits are the full forward's last row up to bf16
  // rounding of the attention's inputs and the summation order.
  GPTConfig c = small_config();
  c.block_size = 600;
  c.n_embd = 128;  // 4 heads of 32 over 2 key/value heads
  GPT m(c, 12);
  m.set_dtype(DType::bf16);
  ThreadContext ctx(2);
  const auto t = tokens_for(270, c.vocab_size, 13);
  ForwardOptions o;
  o.inference = true;
  std::vector<std::vector<float>> want;
  for (int64_t n = 250; n <= 270; ++n) {
    const float* full = m.forward(ctx, t.data(), 1, n, o);
    want.emplace_back(full + (n - 1) * c.vocab_size, full + n * c.vocab_size);
  }
  m.reset_cache();
  const float* dec = m.decode(ctx, t.data(), 250);
  for (int64_t n = 250; n <= 270; ++n) {
    if (n > 250) dec = m.decode(ctx, t.data() + n - 1, 1);
    const std::vector<float>& w = want[static_cast<size_t>(n - 250)];
    double size = 0, diff = 0;
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      size = std::max(size, double(std::fabs(w[v])));
      diff = std::max(diff, double(std::fabs(dec[v] - w[v])));
    }
    EXPECT_LE(diff, 1e-2 * size) << "position " << n;
  }
  EXPECT_EQ(m.cache_length(), 270);
}

TEST(GPT, SkippingTheGatesGradientsLeavesEveryOtherGradientBitForBit) {
  // Training does not read the gates' gradients (ForwardOptions::gate_grads = false): they stay 0,
  // and every weight gradient is what the full backward gives — also with a gate that is not 1.
  GPT m(small_config(), 11);
  ThreadContext ctx(2);
  const auto x = tokens_for(2 * 20, m.config().vocab_size, 3);
  const auto y = tokens_for(2 * 20, m.config().vocab_size, 4);
  for (float gate : {1.0f, 0.5f}) {
    m.gates().values()[1] = gate;
    m.zero_grads();
    m.forward_backward(ctx, x.data(), y.data(), 2, 20);
    const std::vector<float> want(m.grads(), m.grads() + m.layout().total());
    EXPECT_NE(m.gates().grads()[0], 0.0f);
    ForwardOptions o;
    o.gate_grads = false;
    m.zero_grads();
    m.forward_backward(ctx, x.data(), y.data(), 2, 20, o);
    for (int64_t i = 0; i < m.layout().total(); ++i)
      ASSERT_EQ(m.grads()[i], want[static_cast<size_t>(i)]) << gate << " " << i;
    if (gate == 1.0f) {
      EXPECT_EQ(m.gates().grads()[0], 0.0f);  // layer 0: not computed
    }
  }
}

TEST(GPT, GateZeroRemovesAHeadAndItsGradientIsExact) {
  GPTConfig c = small_config();
  c.n_kv_head = 4;
  GPT m(c, 4);
  ThreadContext ctx(1);
  const auto x = tokens_for(24, c.vocab_size, 1), y = tokens_for(24, c.vocab_size, 2);
  m.zero_grads();
  m.forward_backward(ctx, x.data(), y.data(), 1, 24);
  const double g = m.gates().grads()[5];
  // Central difference of the loss in gate (layer 1, head 1).
  const float h = 1e-2f;
  m.gates().values()[5] = 1.0f + h;
  const double up = m.loss(ctx, x.data(), y.data(), 1, 24);
  m.gates().values()[5] = 1.0f - h;
  const double down = m.loss(ctx, x.data(), y.data(), 1, 24);
  EXPECT_NEAR(g, (up - down) / (2 * h), 2e-3 * std::max(1.0, std::abs(g)));
}

TEST(GPT, RowStatisticsAndOneHeadsAttentionEqualTheFullCapture) {
  // Grouped-query heads, one layer's groups unequal (a pruned model's layout).
  GPTConfig c = small_config();
  c.n_head = 6;
  c.n_kv_head = 2;
  c.n_embd = 48;
  c.layer_heads = {6, 5};
  c.layer_kv_heads = {2, 2};
  c.layer_groups = {{3, 3}, {2, 3}};
  GPT m(c, 9);
  ThreadContext ctx(2);
  const int64_t T = 19, L = c.n_layer, H = c.n_head;
  const auto tokens = tokens_for(T, c.vocab_size, 4);
  std::vector<float> probs(static_cast<size_t>(L * H * T * T), 0.0f);
  ForwardOptions all;
  all.attention_probs = probs.data();
  const float* a = m.forward(ctx, tokens.data(), 1, T, all);
  const std::vector<float> logits(a, a + T * c.vocab_size);
  std::vector<float> entropy(static_cast<size_t>(L * H * T), -1.0f), top(entropy.size(), -1.0f);
  std::vector<int64_t> arg(entropy.size(), -2);
  ForwardOptions stats;
  stats.inference = true;
  stats.attention_entropy = entropy.data();
  stats.attention_argmax = arg.data();
  stats.attention_max_weight = top.data();
  const float* b = m.forward(ctx, tokens.data(), 1, T, stats);
  for (int64_t i = 0; i < T * c.vocab_size; ++i) ASSERT_NEAR(b[i], logits[i], 1e-5) << i;
  std::vector<float> one(static_cast<size_t>(T * T));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < c.heads(l); ++h) {
      const float* p = probs.data() + (l * H + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        double ent = 0, best = -1;
        for (int64_t j = 0; j < T; ++j) {
          const double w = p[i * T + j];
          if (w > 0) ent -= w * std::log(w);
          if (w > best) best = w;
        }
        const size_t k = static_cast<size_t>((l * H + h) * T + i);
        EXPECT_NEAR(entropy[k], ent, 1e-4) << l << " " << h << " " << i;
        EXPECT_NEAR(top[k], best, 1e-5);
        EXPECT_NEAR(p[i * T + arg[k]], best, 1e-5);  // the argmax or a key tied with it
      }
      // One head recomputed after the forward: the same matrix.
      m.head_attention(ctx, l, h, one.data());
      for (int64_t i = 0; i < T * T; ++i)
        ASSERT_NEAR(one[i], p[i], 1e-6) << l << " " << h << " " << i;
    }
  expect_error([&] { m.head_attention(ctx, 1, 5, one.data()); }, {"head_attention: (1, 5)"});
  m.reset_cache();
  m.decode(ctx, tokens.data(), 3);
  expect_error([&] { m.head_attention(ctx, 0, 0, one.data()); }, {"not decoding"});
}

TEST(Tokenizer, RoundTripsAndSerialises) {
  const std::string text = "the cat sat on the mat; the cat ate 42 rats.\n";
  std::string corpus;
  for (int i = 0; i < 50; ++i) corpus += text;
  const Tokenizer bpe = Tokenizer::train_bpe(corpus, 300);
  EXPECT_TRUE(bpe.is_bpe());
  EXPECT_LE(bpe.vocab_size(), 300);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  for (const Tokenizer& t : {Tokenizer::byte_level(), bpe, Tokenizer::from_json(bpe.to_json())}) {
    EXPECT_EQ(t.decode(t.encode(corpus)), corpus);
    EXPECT_EQ(t.decode(t.encode(all_bytes)), all_bytes);
  }
  EXPECT_LT(bpe.encode(corpus).size(), corpus.size() / 3);
  EXPECT_EQ(Tokenizer::from_json(bpe.to_json()).encode(corpus), bpe.encode(corpus));
  expect_error([] { Tokenizer::from_json(R"({"type":"bpe","merges":[[0,300]]})"); },
               {"not yet defined"});
  expect_error([] { Tokenizer::from_json(R"({"type":"wordpiece"})"); }, {"unknown type"});
  expect_error([&] { bpe.decode(std::vector<int32_t>{1000}); }, {"tokens: id 1000"});
}

TEST(Sampling, GreedyTopKAndTopP) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.9f};
  Generator g(1);
  EXPECT_EQ(sample_token(logits, {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0}, g),
            1);
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < 2000; ++i)
    ++counts[sample_token(logits, {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 0}, g)];
  EXPECT_EQ(counts[0] + counts[2], 0);  // top-2 keeps tokens 1 and 3 only
  EXPECT_GT(counts[3], 700);
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(sample_token(logits, {.temperature = 1.0f, .top_k = 0, .top_p = 0.3f, .seed = 0}, g),
              1);
  expect_error(
      [] { validate(SamplingOptions{.temperature = -1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0}); },
      {"temperature"});
}

// A step in micro-batches (ForwardOptions::micro_batches) has the same bits for any thread count:
// whole parts on one thread each when the threads divide them (2 and 4 parts on 2 and 4 threads),
// in turn otherwise (1 and 3 threads); in float32 and mixed precision, with dropout.
TEST(GPT, MicroBatchedStepIsBitwiseTheSameForAnyThreadCount) {
  GPTConfig c = small_config();
  c.dropout = 0.1f;
  const auto x = tokens_for(4 * 24, c.vocab_size, 5), y = tokens_for(4 * 24, c.vocab_size, 6);
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t parts : {2, 4}) {
      ForwardOptions o;
      o.train = true;
      o.seed = 99;
      o.gate_grads = false;
      o.micro_batches = parts;
      std::vector<std::vector<float>> grads;
      std::vector<double> losses;
      for (int threads : {1, 2, 3, 4}) {
        GPT m(c, 3);
        m.set_dtype(dtype);
        ThreadContext ctx(threads);
        losses.push_back(m.forward_backward(ctx, x.data(), y.data(), 4, 24, o));
        grads.emplace_back(m.grads(), m.grads() + m.layout().total());
      }
      for (size_t i = 1; i < losses.size(); ++i) {
        EXPECT_EQ(losses[i], losses[0]) << dtype_name(dtype) << " " << parts << " parts, " << i;
        EXPECT_EQ(grads[i], grads[0]) << dtype_name(dtype) << " " << parts << " parts, " << i;
      }
    }
}

// Without dropout the parts compute the whole batch's step: the mean over the whole batch's
// targets (ignored targets fall unevenly on the parts, so a mean per part would differ), the same
// gradients up to the order of their sums, added into grads() like the whole batch's (a second
// step without zero_grads doubles them: the parts' own arenas start each step at zero).
TEST(GPT, MicroBatchesComputeTheWholeBatchsStep) {
  const GPTConfig c = small_config();
  const auto x = tokens_for(4 * 24, c.vocab_size, 5);
  auto y = tokens_for(4 * 24, c.vocab_size, 6);
  for (int64_t i = 0; i < 30; ++i) y[static_cast<size_t>(i)] = -1;  // 30 of the first part's 48
  ForwardOptions o;
  o.gate_grads = false;
  ThreadContext ctx(2);
  o.micro_batches = 1;
  GPT whole(c, 3);
  const double want = whole.forward_backward(ctx, x.data(), y.data(), 4, 24, o);
  const int64_t n = whole.layout().total();
  const std::vector<float> g(whole.grads(), whole.grads() + n);
  float scale = 0.0f;
  for (const float v : g) scale = std::max(scale, std::abs(v));
  for (int64_t parts : {2, 4}) {
    o.micro_batches = parts;
    GPT m(c, 3);
    const double got = m.forward_backward(ctx, x.data(), y.data(), 4, 24, o);
    EXPECT_NEAR(got, want, 1e-6 * std::abs(want)) << parts;
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(m.grads()[i], g[size_t(i)], 1e-5 * scale) << i;
    m.forward_backward(ctx, x.data(), y.data(), 4, 24, o);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(m.grads()[i], 2 * g[size_t(i)], 2e-5 * scale) << i;
  }
}

TEST(GPT, MicroBatchesComeFromTheShapeAndAreRefusedByName) {
  GPTConfig c = small_config();
  c.block_size = 256;
  GPT m(c, 3);
  ForwardOptions o;
  o.gate_grads = false;
  // Halved while a part keeps kMicroBatchRows rows, up to kMaxMicroBatches parts.
  EXPECT_EQ(m.micro_batches_for(16, 128, o), 2);
  EXPECT_EQ(m.micro_batches_for(16, 64, o), 1);
  EXPECT_EQ(m.micro_batches_for(64, 128, o), 8);
  EXPECT_EQ(m.micro_batches_for(256, 256, o), kMaxMicroBatches);
  EXPECT_EQ(m.micro_batches_for(15, 256, o), 1);  // an odd batch
  EXPECT_EQ(m.micro_batches_for(12, 256, o), 2);  // 3 of 1024 rows do not halve
  ForwardOptions gates = o;
  gates.gate_grads = true;
  EXPECT_EQ(m.micro_batches_for(16, 128, gates), 1);
  ForwardOptions packed = o;
  packed.lengths = {100, 28};
  EXPECT_EQ(m.micro_batches_for(16, 128, packed), 1);
  ThreadContext ctx(2);
  const auto x = tokens_for(4 * 24, c.vocab_size, 5), y = tokens_for(4 * 24, c.vocab_size, 6);
  ForwardOptions bad = o;
  bad.micro_batches = 3;
  expect_error([&] { m.forward_backward(ctx, x.data(), y.data(), 4, 24, bad); },
               {"micro_batches", "3 does not divide the batch of 4"});
  bad.micro_batches = -1;
  expect_error([&] { m.micro_batches_for(4, 24, bad); }, {"micro_batches", "≥ 0"});
  gates.micro_batches = 2;
  expect_error([&] { m.forward_backward(ctx, x.data(), y.data(), 4, 24, gates); },
               {"micro_batches", "gate_grads"});
  ForwardOptions split = o;
  split.micro_batches = 2;
  m.forward_backward(ctx, x.data(), y.data(), 4, 24, split);
  std::vector<float> dout(4 * 24 * c.vocab_size, 1.0f);
  expect_error([&] { m.backward(ctx, x.data(), dout.data(), split); },
               {"backward", "micro-batches", "forward() first"});
  m.forward(ctx, x.data(), 4, 24, split);  // a whole forward, then its backward
  m.backward(ctx, x.data(), dout.data(), split);
}

}  // namespace
}  // namespace headlight::model

// headlight attention-demo: multi-head self-attention over a short sentence with seeded weights,
// printing each head's attention matrix as a text heatmap. The weights are random (seeded), so the
// patterns show the machinery, not learned behaviour; a later issue ships a trained model.

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/attention/multihead_attention.h"
#include "headlight/core/rng.h"
#include "options.h"

namespace headlight::cli {
namespace {

struct DemoArgs {
  std::string text = "Maria found a red key in the kitchen . Later she opened the door";
  int64_t heads = 4;
  int64_t embed_dim = 32;
  uint64_t seed = 7;
  bool causal = false;
  bool json = false;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// One seeded vector per distinct word plus sinusoidal positions: [L, E].
Tensor embed(const std::vector<std::string>& words, int64_t E, uint64_t seed) {
  Tensor x = Tensor::empty({static_cast<int64_t>(words.size()), E});
  for (size_t p = 0; p < words.size(); ++p) {
    Generator g(seed ^ fnv1a(words[p]));
    for (int64_t i = 0; i < E; ++i) {
      const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * (i / 2) / E);
      x.data()[static_cast<int64_t>(p) * E + i] =
          3.0f * g.normal() + static_cast<float>(i % 2 ? std::cos(angle) : std::sin(angle));
    }
  }
  return x;
}

// Shade of weight w relative to the largest weight of its row.
std::string shade(float w, float row_max) {
  static const char* levels[] = {"  ", "░░", "▒▒", "▓▓", "██"};
  const float r = row_max > 0 ? w / row_max : 0.0f;
  return levels[r < 0.2f ? 0 : std::min(4, static_cast<int>(r * 4.0f + 0.2f))];
}

}  // namespace

void add_attention_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  auto* cmd = app.add_subcommand(
      "attention-demo",
      "Multi-head self-attention over a sentence; each head's attention as a heatmap");
  cmd->add_option("--text", args->text, "Words separated by spaces")->capture_default_str();
  positive(cmd->add_option("--heads", args->heads, "Attention heads")->capture_default_str());
  positive(
      cmd->add_option("--embed-dim", args->embed_dim, "Embedding width")->capture_default_str());
  cmd->add_option("--seed", args->seed, "Seed of the weights and embeddings")
      ->capture_default_str();
  cmd->add_flag("--causal", args->causal, "Causal mask (each word sees only earlier words)");
  cmd->add_flag("--json", args->json, "Print the attention matrices as JSON");
  cmd->callback([args] {
    std::vector<std::string> words;
    std::istringstream in(args->text);
    for (std::string w; in >> w;) words.push_back(w);
    check(!words.empty(), "--text: no words in '{}'", args->text);
    const int64_t L = static_cast<int64_t>(words.size()), H = args->heads;

    attention::MultiheadAttention mha({.embed_dim = args->embed_dim, .num_heads = H}, args->seed);
    mha.set_training(false);
    ThreadContext ctx;
    Tensor x = embed(words, args->embed_dim, args->seed);
    const attention::MhaForwardOptions options{.average_attn_weights = false,
                                               .is_causal = args->causal};
    attention::MhaOutput out = mha.forward(ctx, x.view(), x.view(), x.view(), options);
    const float* w = out.weights.data();  // [H, L, L]

    if (args->json) {
      nlohmann::json j{{"words", words}, {"heads", nlohmann::json::array()}};
      for (int64_t h = 0; h < H; ++h) {
        std::vector<std::vector<float>> m(static_cast<size_t>(L));
        for (int64_t i = 0; i < L; ++i) m[i].assign(w + (h * L + i) * L, w + (h * L + i + 1) * L);
        j["heads"].push_back(m);
      }
      fmt::print("{}\n", j.dump());
      return;
    }
    size_t width = 0;
    for (const auto& word : words) width = std::max(width, word.size());
    fmt::print(
        "Multi-head self-attention over {} words, {} heads of dim {} (seeded random weights{}).\n",
        L, H, args->embed_dim / H, args->causal ? ", causal" : "");
    fmt::print(
        "Rows are queries, columns keys (numbered mod 10); darker = more attention, relative\n"
        "to the row's largest weight; the arrow names the most attended word.\n");
    for (int64_t h = 0; h < H; ++h) {
      fmt::print("\nhead {}\n{:>{}}  ", h, "", width);
      for (int64_t j = 0; j < L; ++j) fmt::print("{:<2}", j % 10);
      fmt::print("\n");
      for (int64_t i = 0; i < L; ++i) {
        fmt::print("{:>{}}  ", words[i], width);
        const float* row = w + (h * L + i) * L;
        int64_t best = 0;
        for (int64_t j = 1; j < L; ++j)
          if (row[j] > row[best]) best = j;
        for (int64_t j = 0; j < L; ++j) fmt::print("{}", shade(row[j], row[best]));
        fmt::print("  → {} ({:.2f})\n", words[best], w[(h * L + i) * L + best]);
      }
    }
  });
}

}  // namespace headlight::cli

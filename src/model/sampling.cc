// Sampling (greedy, temperature, top-k, top-p) and generation with the KV cache.

#include "headlight/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "headlight/core/error.h"

namespace headlight::model {

void validate(const SamplingOptions& o) {
  check(std::isfinite(o.temperature) && o.temperature >= 0.0f,
        "temperature: must be finite and ≥ 0, got {}", o.temperature);
  check(o.top_k >= 0, "top_k: must be ≥ 0 (0: off), got {}", o.top_k);
  check(o.top_p > 0.0f && o.top_p <= 1.0f, "top_p: must be in (0, 1], got {}", o.top_p);
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, Generator& gen) {
  const size_t n = logits.size();
  if (o.temperature == 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates sorted by logit, largest first (ties: lower id first, so draws are reproducible).
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  size_t keep = n;
  if (o.top_k > 0) keep = std::min(keep, static_cast<size_t>(o.top_k));
  std::vector<double> prob(keep);
  const double top = logits[static_cast<size_t>(order[0])];
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((logits[static_cast<size_t>(order[i])] - top) / o.temperature);
    sum += prob[i];
  }
  if (o.top_p < 1.0f) {
    double acc = 0.0;
    size_t i = 0;
    while (i < keep) {
      acc += prob[i] / sum;
      ++i;
      if (acc >= o.top_p) break;
    }
    keep = i;
    sum = 0.0;
    for (size_t j = 0; j < keep; ++j) sum += prob[j];
  }
  const double u = static_cast<double>(gen.uniform()) * sum;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate(ThreadContext& ctx, GPT& model, std::span<const int32_t> prompt,
                              int64_t max_new_tokens, const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token) {
  validate(o);
  check(!prompt.empty(), "prompt: needs at least one token");
  check(max_new_tokens >= 0, "max_new_tokens: must be ≥ 0, got {}", max_new_tokens);
  check(model.config().lm_head, "generate: the model has no LM head (an encoder)");
  const int64_t block = model.config().block_size;
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  std::vector<int32_t> produced;
  Generator gen(o.seed);
  // Prefill: the last block_size tokens of the prompt.
  model.reset_cache();
  const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - block);
  const float* logits =
      model.decode(ctx, context.data() + start, static_cast<int64_t>(context.size()) - start);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int32_t next = sample_token({logits, static_cast<size_t>(vocab)}, o, gen);
    produced.push_back(next);
    context.push_back(next);
    if (on_token) on_token(next);
    if (step + 1 == max_new_tokens ||
        std::find(o.stop_tokens.begin(), o.stop_tokens.end(), next) != o.stop_tokens.end())
      break;
    if (model.cache_length() < block) {
      logits = model.decode(ctx, &next, 1);
    } else {
      model.reset_cache();
      logits =
          model.decode(ctx, context.data() + context.size() - static_cast<size_t>(block), block);
    }
  }
  return produced;
}

}  // namespace headlight::model

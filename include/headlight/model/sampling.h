// Choosing the next token from logits, and generation with the KV cache.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "headlight/core/rng.h"
#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"

namespace headlight::model {

struct SamplingOptions {
  float temperature = 1.0f;  // 0: greedy (the most likely token)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only
  float top_p = 1.0f;        // < 1: among the smallest set whose probability reaches top_p
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens{};  // generation ends after producing one of these (kept)
};

// Throws Error naming the option when temperature < 0, top_k < 0 or top_p outside (0, 1].
void validate(const SamplingOptions& o);

// The next token from logits[vocab]: greedy at temperature 0 (the first maximum), otherwise a draw
// from softmax(logits / temperature) restricted by top_k, then top_p.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, Generator& gen);

// Appends up to max_new_tokens tokens to `prompt` (non-empty), calling on_token with each as it is
// produced, and returns the new tokens. Keys and values are cached: each step runs the model on
// one token. Past block_size the context is the last block_size tokens, recomputed (as nanoGPT
// crops its context).
std::vector<int32_t> generate(ThreadContext& ctx, GPT& model, std::span<const int32_t> prompt,
                              int64_t max_new_tokens, const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace headlight::model

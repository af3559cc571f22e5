// The training objective over a token stream, in one place for the trainer's batches, its
// evaluation and the datasets that head importance and pruning are scored on (inspect/).
//
// Decoders (causal) predict the next token: a window of `seq` inputs reads seq + 1 tokens of the
// stream, and the target of position t is the token after it.
// Encoders (causal = false) predict masked tokens (masked-language modelling): each position's
// input is replaced by the mask token with probability mask_fraction, one draw per position in
// order from the caller's Generator; only masked positions have a target (−1 elsewhere, which the
// loss ignores). The mask token is vocab_size − 1, which the tokenizer must leave unused (`train`
// makes the vocabulary one larger than the tokenizer's for encoders).
#pragma once

#include <cstdint>
#include <span>

#include "headlight/core/rng.h"
#include "headlight/model/config.h"

namespace headlight::train {

inline constexpr float kMaskFraction = 0.15f;  // BERT's

struct Objective {
  bool causal = true;
  int32_t mask_token = 0;  // encoders only
  float mask_fraction = kMaskFraction;

  static Objective of(const model::GPTConfig& c, float mask_fraction = kMaskFraction) {
    return {.causal = c.causal,
            .mask_token = static_cast<int32_t>(c.vocab_size - 1),
            .mask_fraction = mask_fraction};
  }
  // Tokens of the stream that one window of `seq` inputs reads.
  int64_t span(int64_t seq) const { return causal ? seq + 1 : seq; }
  // How many consecutive windows of `seq` inputs a stream of `tokens` holds.
  int64_t windows(int64_t tokens, int64_t seq) const { return (tokens - (span(seq) - seq)) / seq; }
  // tokens[seq], targets[seq] of the window that starts at `from` (span(seq) tokens of it are
  // read).
  void fill(const int32_t* from, int64_t seq, Generator& g, int32_t* tokens,
            int32_t* targets) const {
    for (int64_t t = 0; t < seq; ++t) {
      if (causal) {
        tokens[t] = from[t];
        targets[t] = from[t + 1];
      } else {
        const bool masked = g.uniform() < mask_fraction;
        tokens[t] = masked ? mask_token : from[t];
        targets[t] = masked ? from[t] : -1;
      }
    }
  }
};

}  // namespace headlight::train

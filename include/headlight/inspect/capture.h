// Attention capture: for a text and a model, the exact attention of every layer and head (the fused
// kernels' probabilities, recomputed from the saved log-sum-exp, not a slow path), per-head
// statistics, and a word-level view. Exported as JSON and .npy.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "headlight/core/atomic_file.h"
#include "headlight/core/thread_context.h"
#include "headlight/model/gpt.h"
#include "headlight/model/text_tokenizer.h"
#include "headlight/model/tokenizer.h"

namespace headlight::inspect {

// A word: tokens [first, last] (a new word starts at a token beginning with a space or a newline,
// or after a token ending with a newline; whitespace-only tokens stay with the word before them;
// a special token — "[CLS]", "<|im_end|>", "<s>" — is a word of its own). Token texts are those
// of TextTokenizer::token_bytes: byte-level BPE's "Ġ" is a space there and WordPiece's "##" a join.
struct Word {
  std::string text;
  int64_t first = 0;
  int64_t last = 0;
};

// Statistics of one head over the query rows of a capture:
//   entropy        mean over rows of −Σ_j P_ij log P_ij (nats)
//   mean_distance  mean over rows of Σ_j P_ij |i − j| (tokens)
//   first_token    mean over rows i ≥ 1 of P_i0, the weight on the first token
struct HeadStats {
  double entropy = 0.0;
  double mean_distance = 0.0;
  double first_token = 0.0;
};

struct Capture {
  std::vector<int32_t> tokens;
  std::vector<std::string> token_text;  // the bytes of each token
  std::vector<Word> words;
  int64_t n_layer = 0, n_head = 0, seq = 0;
  std::vector<int64_t> layer_heads;  // heads present in each layer (pruned models have fewer)
  std::vector<float> probs;          // [n_layer, n_head, seq, seq]; absent heads are zero
  std::vector<HeadStats> stats;      // [n_layer, n_head]

  const float* head(int64_t layer, int64_t h) const {
    return probs.data() + (layer * n_head + h) * seq * seq;
  }
};

// Captures the attention of `tokens` (1 ≤ length ≤ block_size; throws naming `text` otherwise).
Capture capture_tokens(ThreadContext& ctx, model::GPT& m, const model::TextTokenizer* tokenizer,
                       std::span<const int32_t> tokens);
Capture capture_text(ThreadContext& ctx, model::GPT& m, const model::TextTokenizer& tokenizer,
                     std::string_view text);

// A capture of attention computed elsewhere (a PyTorch model through headlight.torch.capture):
// probs [n_layer, n_head, seq, seq] with seq = tokens.size() = token_text.size(); the words and
// per-head statistics are filled in. Throws naming the argument when the sizes disagree.
Capture capture_from_probs(std::vector<int32_t> tokens, std::vector<std::string> token_text,
                           int64_t n_layer, int64_t n_head, std::vector<float> probs);

// The statistics of one attention matrix p [seq, seq].
HeadStats head_stats(const float* p, int64_t seq);

// Words of a token sequence (see Word).
std::vector<Word> split_words(const std::vector<std::string>& token_text);

// The word-level view [n_layer, n_head, W, W]: a word's tokens summed as keys and averaged as
// queries (rows still sum to 1).
std::vector<float> word_attention(const Capture& c);

// JSON: tokens, token texts, words, statistics, the probabilities (nested arrays; each row up to
// its last non-zero weight) and the word view ("word_probs").
std::string to_json(const Capture& c, bool include_probs = true);

// A little-endian float32 .npy file (NumPy format 1.0) of `data` with `shape`, written to `out` and
// committed.
void write_npy(AtomicFile& out, const float* data, const std::vector<int64_t>& shape);

}  // namespace headlight::inspect

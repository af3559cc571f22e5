// Sentence embeddings from an encoder (a model with pooling, load/model.h): each text tokenised
// (special tokens added, cut to the model's max_seq_length as sentence-transformers cuts it), run
// through the model, its hidden states pooled (the [CLS] position, or the mean over its tokens)
// and, when the model says so, L2-normalised.
//
// A batch's texts are packed end to end (model::ForwardOptions::lengths): each attends within
// itself and no position is padding.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/core/thread_context.h"
#include "headlight/load/model.h"

namespace headlight::load {

struct EmbedOptions {
  int64_t batch_size = 32;  // texts per forward at most
  // Called after each batch with the number of texts done and the total (a progress bar).
  std::function<void(int64_t, int64_t)> progress{};
};

// The tokens of one text as embed_texts feeds them: special tokens added, then cut as the
// tokenizers library truncates to max_len (the text's own tokens are cut so that they and the
// special tokens around them, BERT's [CLS] … [SEP], fit). Throws when the text has no tokens.
std::vector<int32_t> embedding_tokens(const model::TextTokenizer& t, const std::string& text,
                                      int64_t max_len);

// [texts, n_embd] float32. Throws Error when the model has no pooling or no tokenizer.
Tensor embed_texts(ThreadContext& ctx, Model& m, std::span<const std::string> texts,
                   const EmbedOptions& o = {});

// Pools hidden states h [T, C] of one sequence into out [C] (mode cls or mean, then the optional
// L2 normalisation).
void pool(const Pooling& p, const float* h, int64_t T, int64_t C, float* out);

}  // namespace headlight::load

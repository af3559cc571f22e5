// Checkpoints: a model (weights, config and tokenizer) in one safetensors file, and the
// optimizer's state and step in a second file beside it ("<path>.optim.safetensors") for resuming.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "headlight/model/gpt.h"
#include "headlight/model/tokenizer.h"

namespace headlight::train {

struct LoadedModel {
  model::GPT model;
  std::optional<model::Tokenizer> tokenizer;  // absent when the file stores none (token ids only)
};

// Writes the weights (names and layout of docs/design.md §2) with metadata "headlight.config",
// "headlight.tokenizer" (when a tokenizer is given) and "format": "pt" (so PyTorch tools accept
// it), atomically.
void save_model(const std::string& path, const model::GPT& m, const model::Tokenizer* tokenizer,
                const std::map<std::string, std::string>& extra_metadata = {});
// Reads and validates a checkpoint (see io/safetensors.h and GPT(const TensorSource&)).
LoadedModel load_model(const std::string& path);

// The optimizer's file for a model checkpoint path.
std::string optimizer_path(const std::string& model_path);

}  // namespace headlight::train

// Model checkpoints through the safetensors reader and writer.

#include "headlight/train/checkpoint.h"

#include <vector>

#include "headlight/io/safetensors.h"

namespace headlight::train {

void save_model(const std::string& path, const model::GPT& m, const model::Tokenizer* tokenizer,
                const std::map<std::string, std::string>& extra_metadata) {
  std::vector<io::TensorToWrite> tensors;
  for (const model::ParameterEntry& e : m.layout().entries())
    tensors.push_back({e.name, e.shape, m.params() + e.offset});
  std::map<std::string, std::string> metadata = extra_metadata;
  metadata["format"] = "pt";
  metadata["headlight.config"] = model::to_json(m.config());
  if (tokenizer) {
    check(tokenizer->vocab_size() <= m.config().vocab_size,
          "{}: the tokenizer has {} tokens, more than the model's vocab_size {}", path,
          tokenizer->vocab_size(), m.config().vocab_size);
    metadata["headlight.tokenizer"] = tokenizer->to_json();
  }
  io::write_safetensors(path, tensors, metadata);
}

LoadedModel load_model(const std::string& path) {
  const io::SafetensorsFile file(path);
  model::GPT gpt(file);
  const auto tok = file.metadata("headlight.tokenizer");
  std::optional<model::Tokenizer> tokenizer;
  if (tok) {
    tokenizer = model::Tokenizer::from_json(*tok);
    check(tokenizer->vocab_size() <= gpt.config().vocab_size,
          "{}: the tokenizer has {} tokens, more than the model's vocab_size {}", path,
          tokenizer->vocab_size(), gpt.config().vocab_size);
  }
  return {std::move(gpt), std::move(tokenizer)};
}

std::string optimizer_path(const std::string& model_path) {
  std::string base = model_path;
  if (base.ends_with(".safetensors")) base.resize(base.size() - 12);
  return base + ".optim.safetensors";
}

}  // namespace headlight::train

// Models from the files people have: a headlight checkpoint (.safetensors with headlight's
// metadata), a Hugging Face folder (config.json + model.safetensors or a sharded
// model.safetensors.index.json + tokenizer.json), or a GGUF file. Each is mapped onto headlight's
// GPT (model/gpt.h), whose blocks cover the architectures below; the weights are read once into
// the model's arena (quantised GGUF tensors dequantised to float32).
//
//   Hugging Face folder, by config.json's "architectures":
//     BertModel (also BertForMaskedLM & co., whose "bert." weights are used): post-norm encoder,
//       learned positions, token types, embedding LayerNorm, GELU (erf); no LM head, the forward
//       gives hidden states. sentence-transformers folders add modules.json (pooling, Normalize)
//       and sentence_bert_config.json (max_seq_length).
//     GPT2LMHeadModel: pre-norm decoder, learned positions, Conv1D weights stored [in, out].
//     LlamaForCausalLM: pre-norm RMSNorm decoder, rotary positions (rope_theta), grouped-query
//       attention, SwiGLU MLP, no biases, tied or separate output head.
//   GGUF, by general.architecture: llama (q and k rows un-permuted from llama.cpp's rotary layout)
//     and gpt2; the tokenizer from the metadata (load/gguf_tokenizer.h).
// Anything else is an Error naming the architecture and the supported ones; a missing or
// contradictory field is an Error naming the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "headlight/model/gpt.h"
#include "headlight/model/text_tokenizer.h"

namespace headlight::load {

enum class Format : uint8_t { checkpoint, hf_folder, gguf };
const char* format_name(Format f);  // "headlight checkpoint", "Hugging Face folder", "GGUF"

// How an encoder turns its hidden states into one vector per text (sentence-transformers).
struct Pooling {
  enum class Mode : uint8_t { none, cls, mean } mode = Mode::none;
  bool normalize = false;  // L2-normalise the pooled vector
};
const char* pooling_name(Pooling::Mode m);  // "none", "cls", "mean"

struct Model {
  std::string path;
  Format format = Format::checkpoint;
  std::string architecture;  // "headlight", "BertModel", "GPT2LMHeadModel", "LlamaForCausalLM", …
  model::GPT net;
  std::optional<model::TextTokenizer> tokenizer{};  // absent: the model works on token ids only
  std::string tokenizer_error{};  // why it is absent, when the files have one we can't read
  Pooling pooling{};
  int64_t max_seq_length = 0;      // the longest input the model's makers use (≤ block_size)
  std::string chat_template{};     // Jinja text from the files; empty when none
  std::vector<int32_t> eos_ids{};  // ids that end generation
  int32_t bos_id = -1;
  // The parameters' elements by their type in the files ("BF16", "Q4_K", "F32", …; a parameter
  // made of tensors of several types under their names joined by "+"), in order of first
  // appearance: what the weights were before they were read as float32.
  std::vector<std::pair<std::string, int64_t>> stored_dtypes{};
};

// Reads a model from `path` (a checkpoint file, a Hugging Face folder or a .gguf file).
Model load_model(const std::string& path);

// Writes `net` (the source's model, or a pruned copy of it) as a headlight checkpoint at `path`
// (atomically) that load_model reads back as the source was read: a headlight model's own
// tokenizer as before; a real model's tokenizer as Hugging Face tokenizer.json text (the folder's
// own file, or made from the GGUF metadata) under "headlight.hf_tokenizer", and its architecture,
// pooling, max_seq_length, chat template and end tokens under "headlight.source".
void write_model(const Model& source, const model::GPT& net, const std::string& path);

}  // namespace headlight::load

// load_model: which reader a path needs (see headlight/load/model.h).

#include "headlight/load/model.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "headlight/io/safetensors.h"
#include "headlight/train/checkpoint.h"
#include "src/load/loaders.h"

namespace headlight::load {

const char* format_name(Format f) {
  switch (f) {
    case Format::checkpoint:
      return "headlight checkpoint";
    case Format::hf_folder:
      return "Hugging Face folder";
    case Format::gguf:
      return "GGUF";
  }
  return "?";
}

const char* pooling_name(Pooling::Mode m) {
  switch (m) {
    case Pooling::Mode::none:
      return "none";
    case Pooling::Mode::cls:
      return "cls";
    case Pooling::Mode::mean:
      return "mean";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

Model load_model(const std::string& path) {
  check(fs::exists(path), "{}: no such file or folder", path);
  if (fs::is_directory(path)) return load_hf_folder(path);
  if (path.ends_with(".gguf") || starts_with_gguf_magic(path)) return load_gguf(path);
  // A safetensors file: headlight's checkpoint, or the weights of a Hugging Face folder.
  {
    const io::SafetensorsFile file(path);
    if (!file.metadata("headlight.config").has_value() &&
        fs::exists(fs::path(path).parent_path() / "config.json"))
      return load_hf_folder(fs::path(path).parent_path().string());
  }
  train::LoadedModel loaded = train::load_model(path);
  Model m{.path = path,
          .format = Format::checkpoint,
          .architecture = "headlight",
          .net = std::move(loaded.model)};
  if (loaded.tokenizer) m.tokenizer = model::TextTokenizer(std::move(*loaded.tokenizer));
  m.max_seq_length = m.net.config().block_size;
  return m;
}

}  // namespace headlight::load

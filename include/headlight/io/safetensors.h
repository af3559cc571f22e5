// A safetensors reader and writer of our own (https://github.com/huggingface/safetensors format):
//   [8 bytes: header length N, little-endian u64][N bytes: UTF-8 JSON header][data]
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into
// the data), plus an optional "__metadata__" object of string → string.
//
// The reader memory-maps the file and validates it before anything is read: N ≤ 100 MB and within
// the file; the header is UTF-8 JSON, an object; dtypes of the format (F64, F32, F16, BF16, F8_*,
// I64 … I8, U64 … U8, BOOL; read_f32 converts the floating ones); shapes × dtype sizes
// computed with overflow checks and equal to end − begin; in header order the offsets start at 0
// and are contiguous (no overlap, no gap, none out of order) and end exactly at the end of the
// file; no duplicate names. Each failure throws headlight::Error with its specific reason.
//
// The writer writes float32 tensors atomically: a temporary file in the same folder, fsync,
// rename over the target, fsync of the folder; a failure leaves no partial file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/core/tensor_source.h"

namespace headlight::io {

class MappedFile;  // src/io/mapped_file.h

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I64", …
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
};

struct SafetensorsIndex {
  std::vector<SafetensorsEntry> tensors;  // in header order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + N
};

// Validates the bytes of a whole file and returns its index; `what` names the file in errors.
SafetensorsIndex parse_safetensors(std::span<const uint8_t> file, const std::string& what);

// A validated, memory-mapped safetensors file.
class SafetensorsFile : public TensorSource {
 public:
  // Maps and validates `path`; throws Error naming the path and the problem.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsIndex& index() const { return index_; }
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  void read_f32(const std::string& name, float* dst) const override;
  std::string stored_dtype(const std::string& name) const override;
  std::optional<std::string> metadata(const std::string& key) const override;

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  SafetensorsIndex index_;
};

// The weights of a Hugging Face checkpoint split into shards: `model.safetensors.index.json`, whose
// "weight_map" names the shard of every tensor (plain file names beside the index; each shard a
// validated SafetensorsFile, opened once). Every tensor must be in the shard the map names; a name,
// a shard or a field that is not so is an Error naming the index file.
class ShardedSafetensors : public TensorSource {
 public:
  explicit ShardedSafetensors(const std::string& index_path);
  ~ShardedSafetensors() override;
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  void read_f32(const std::string& name, float* dst) const override;
  std::string stored_dtype(const std::string& name) const override;
  // The index's "metadata" entries that are strings (total_size is given as its decimal text).
  std::optional<std::string> metadata(const std::string& key) const override;

 private:
  const SafetensorsFile& shard_of(const std::string& name) const;
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t> shard_by_tensor_;  // tensor → index into shards_
  std::vector<std::string> names_;                 // in the map's order
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  Shape shape;
  const float* data = nullptr;  // numel(shape) floats
};

// Writes the tensors (float32, in the given order) and the metadata to `path` atomically.
void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace headlight::io

// A GGUF reader (the file format of llama.cpp and ggml), versions 2 and 3:
//   magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
//   metadata: (string key, u32 value type, value)…   string = u64 length + bytes
//   tensor infos: (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)…
//   padding to `general.alignment` (32 by default), then the tensor data, each tensor at its offset
//   from the start of the data (a multiple of the alignment).
// All little-endian. ne[0] is the fastest-varying dimension, so a [out, in] weight has ne = {in,
// out}; shapes here are given the other way round, as PyTorch and safetensors give them.
//
// The file is memory-mapped and validated before anything is read, because crafted counts are how
// GGUF parsers have been broken: every count, length and size is checked against the bytes that
// remain before it is used or allocated (strings, arrays, the numbers of keys and tensors), array
// nesting is bounded, dimensions are multiplied with overflow checks, the alignment must be a power
// of two, each tensor's offset must be aligned, its bytes (from its type's block size) must lie
// inside the file, and names and keys must be unique. Every failure is an Error naming the file and
// the field.
//
// Tensor types read (dequantised to float32 as the gguf package's numpy reference does, bit for
// bit): F32, F16, BF16, Q8_0, Q4_0, Q4_1 (blocks of 32) and Q4_K, Q5_K, Q6_K (blocks of 256).
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

enum class GgufValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 8,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  bf16 = 30,
};
// "F32", "Q4_K", …; for other ggml type numbers their ggml name when known ("Q5_0", "IQ2_XS", …)
// or "type N".
std::string ggml_type_name(uint32_t type);

// One metadata value: a scalar (integers as int64/uint64, floats as double), a string, or an array
// of values of one type.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  int64_t i = 0;                                   // signed integer types and bool
  uint64_t u = 0;                                  // unsigned integer types
  double f = 0;                                    // f32, f64
  std::string s;                                   // string
  GgufValueType element_type = GgufValueType::u8;  // array
  std::vector<GgufValue> items;                    // array

  bool is_integer() const;
  // The value as an integer (any integer type or bool); throws naming `key` otherwise.
  int64_t as_int(const std::string& key) const;
  double as_float(const std::string& key) const;  // f32, f64 or an integer
  const std::string& as_string(const std::string& key) const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] fastest
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t bytes = 0;
  Shape shape() const;  // PyTorch order (ne reversed)
  int64_t numel() const;
};

struct GgufIndex {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_start = 0;
  std::map<std::string, GgufValue> metadata;
  std::vector<std::string> keys;        // metadata keys in file order
  std::vector<GgufTensorInfo> tensors;  // in file order
};

// Validates the bytes of a whole file and returns its index; `what` names the file in errors.
GgufIndex parse_gguf(std::span<const uint8_t> file, const std::string& what);

// Dequantises `count` elements of type `type` (a whole number of blocks) from `src` into `dst`.
void dequantize(GgmlType type, const uint8_t* src, int64_t count, float* dst);

// A validated, memory-mapped GGUF file. As a TensorSource its names are the GGUF tensor names,
// its shapes PyTorch-ordered, read_f32 dequantises, and metadata(key) gives string values as they
// are and scalars as decimal text (arrays: nullopt; use value()).
class GgufFile : public TensorSource {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile() override;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const GgufIndex& index() const { return index_; }
  const std::string& path() const { return path_; }
  // The metadata value `key`, or nullptr.
  const GgufValue* value(const std::string& key) const;
  const GgufTensorInfo& tensor(const std::string& name) const;  // throws naming it when absent

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  void read_f32(const std::string& name, float* dst) const override;
  std::string stored_dtype(const std::string& name) const override;
  std::optional<std::string> metadata(const std::string& key) const override;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  GgufIndex index_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace headlight::io

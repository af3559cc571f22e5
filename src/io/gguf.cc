// GGUF: validation and memory-mapped reading (see the header for the format and the checks).

#include "headlight/io/gguf.h"

#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "headlight/core/error.h"
#include "src/io/dequantize.h"
#include "src/io/mapped_file.h"

namespace headlight::io {

namespace {

constexpr int kMaxArrayDepth = 8;  // arrays of arrays… (no real file nests more than once)
constexpr uint32_t kMaxDims = 4;   // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;

// Reads little-endian fields from the file, checking each against the bytes left.
class Reader {
 public:
  Reader(std::span<const uint8_t> file, const std::string& what) : file_(file), what_(what) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return file_.size() - pos_; }

  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, file_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string string(const std::string& field) {
    const uint64_t n = get<uint64_t>(field.c_str());
    check(n <= left(), "{}: {}: a string of {} bytes is past the end of the file ({} left)", what_,
          field, n, left());
    std::string s(reinterpret_cast<const char*>(file_.data() + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

  void need(uint64_t bytes, const char* field) const {
    check(bytes <= left(), "{}: truncated: {} needs {} bytes at offset {}, {} left", what_, field,
          bytes, pos_, left());
  }

 private:
  std::span<const uint8_t> file_;
  const std::string& what_;
  uint64_t pos_ = 0;
};

// The smallest number of bytes one value of `type` takes in the file (arrays: their header).
uint64_t min_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean:
      return 1;
    case GgufValueType::u16:
    case GgufValueType::i16:
      return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32:
      return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64:
    case GgufValueType::string:
      return 8;
    case GgufValueType::array:
      return 12;
  }
  return 0;
}

GgufValue read_value(Reader& r, uint32_t raw_type, const std::string& key, int depth,
                     const std::string& what) {
  check(raw_type <= static_cast<uint32_t>(GgufValueType::f64),
        "{}: metadata \"{}\": unknown value type {}", what, key, raw_type);
  GgufValue v;
  v.type = static_cast<GgufValueType>(raw_type);
  const char* k = key.c_str();
  switch (v.type) {
    case GgufValueType::u8:
      v.u = r.get<uint8_t>(k);
      break;
    case GgufValueType::i8:
      v.i = r.get<int8_t>(k);
      break;
    case GgufValueType::u16:
      v.u = r.get<uint16_t>(k);
      break;
    case GgufValueType::i16:
      v.i = r.get<int16_t>(k);
      break;
    case GgufValueType::u32:
      v.u = r.get<uint32_t>(k);
      break;
    case GgufValueType::i32:
      v.i = r.get<int32_t>(k);
      break;
    case GgufValueType::u64:
      v.u = r.get<uint64_t>(k);
      break;
    case GgufValueType::i64:
      v.i = r.get<int64_t>(k);
      break;
    case GgufValueType::f32:
      v.f = r.get<float>(k);
      break;
    case GgufValueType::f64:
      v.f = r.get<double>(k);
      break;
    case GgufValueType::boolean: {
      const uint8_t b = r.get<uint8_t>(k);
      check(b <= 1, "{}: metadata \"{}\": a bool must be 0 or 1, got {}", what, key, b);
      v.i = b;
      break;
    }
    case GgufValueType::string:
      v.s = r.string("metadata \"" + key + "\"");
      break;
    case GgufValueType::array: {
      check(depth < kMaxArrayDepth, "{}: metadata \"{}\": arrays nested deeper than {}", what, key,
            kMaxArrayDepth);
      const uint32_t et = r.get<uint32_t>(k);
      check(et <= static_cast<uint32_t>(GgufValueType::f64),
            "{}: metadata \"{}\": unknown array element type {}", what, key, et);
      v.element_type = static_cast<GgufValueType>(et);
      const uint64_t n = r.get<uint64_t>(k);
      // Every element takes at least min_bytes: a count the rest of the file cannot hold is
      // refused before anything is allocated for it.
      check(n <= r.left() / min_bytes(v.element_type),
            "{}: metadata \"{}\": an array of {} elements cannot fit in the {} bytes left", what,
            key, n, r.left());
      v.items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) v.items.push_back(read_value(r, et, key, depth + 1, what));
      break;
    }
  }
  return v;
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

GgufTensorInfo read_tensor_info(Reader& r, uint64_t index, const std::string& what) {
  GgufTensorInfo t;
  t.name = r.string(fmt::format("tensor {} name", index));
  const std::string field = fmt::format("tensor \"{}\"", t.name);
  const uint32_t n_dims = r.get<uint32_t>(field.c_str());
  check(n_dims >= 1 && n_dims <= kMaxDims, "{}: {}: {} dimensions (1 to {} allowed)", what, field,
        n_dims, kMaxDims);
  uint64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t ne = r.get<uint64_t>(field.c_str());
    check(ne <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
              (ne == 0 || numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ne),
          "{}: {}: the dimensions overflow", what, field);
    numel *= ne;
    t.ne.push_back(ne);
  }
  const uint32_t type = r.get<uint32_t>(field.c_str());
  check(ggml_type_supported(type),
        "{}: {}: tensor type {} is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, "
        "Q6_K)",
        what, field, ggml_type_name(type));
  t.type = static_cast<GgmlType>(type);
  const GgmlBlock blk = ggml_block(t.type);
  check(t.ne[0] % static_cast<uint64_t>(blk.values) == 0,
        "{}: {}: its rows of {} values are not whole {} blocks of {}", what, field, t.ne[0],
        ggml_type_name(type), blk.values);
  const uint64_t blocks = numel / static_cast<uint64_t>(blk.values);
  check(blocks <= std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(blk.bytes),
        "{}: {}: its size overflows", what, field);
  t.bytes = blocks * static_cast<uint64_t>(blk.bytes);
  t.offset = r.get<uint64_t>(field.c_str());
  return t;
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::u16:
    case GgufValueType::i16:
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::boolean:
      return true;
    default:
      return false;
  }
}

int64_t GgufValue::as_int(const std::string& key) const {
  check(is_integer(), "metadata \"{}\": expected an integer", key);
  if (type == GgufValueType::u8 || type == GgufValueType::u16 || type == GgufValueType::u32 ||
      type == GgufValueType::u64) {
    check(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
          "metadata \"{}\": {} is too large", key, u);
    return static_cast<int64_t>(u);
  }
  return i;
}

double GgufValue::as_float(const std::string& key) const {
  if (type == GgufValueType::f32 || type == GgufValueType::f64) return f;
  return static_cast<double>(as_int(key));
}

const std::string& GgufValue::as_string(const std::string& key) const {
  check(type == GgufValueType::string, "metadata \"{}\": expected a string", key);
  return s;
}

Shape GgufTensorInfo::shape() const {
  Shape s;
  for (auto it = ne.rbegin(); it != ne.rend(); ++it) s.push_back(static_cast<int64_t>(*it));
  return s;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (uint64_t d : ne) n *= static_cast<int64_t>(d);
  return n;
}

GgufIndex parse_gguf(std::span<const uint8_t> file, const std::string& what) {
  Reader r(file, what);
  check(file.size() >= 4 && std::memcmp(file.data(), "GGUF", 4) == 0,
        "{}: not a GGUF file (it does not start with \"GGUF\")", what);
  r.get<uint32_t>("magic");
  GgufIndex index;
  index.version = r.get<uint32_t>("version");
  check(index.version == 2 || index.version == 3,
        "{}: GGUF version {} is not supported (2 and 3 are)", what, index.version);
  const uint64_t n_tensors = r.get<uint64_t>("tensor count");
  const uint64_t n_kv = r.get<uint64_t>("metadata count");
  // A key takes at least 12 bytes (its length and type), a tensor info at least 24.
  check(n_kv <= r.left() / 13, "{}: {} metadata entries cannot fit in the {} bytes left", what,
        n_kv, r.left());
  check(n_tensors <= r.left() / 24, "{}: {} tensors cannot fit in the {} bytes left", what,
        n_tensors, r.left());
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.string(fmt::format("metadata key {}", k));
    const uint32_t type = r.get<uint32_t>(key.c_str());
    GgufValue value = read_value(r, type, key, 0, what);
    check(index.metadata.count(key) == 0, "{}: metadata \"{}\" appears twice", what, key);
    index.keys.push_back(key);
    index.metadata.emplace(std::move(key), std::move(value));
  }
  if (auto it = index.metadata.find("general.alignment"); it != index.metadata.end()) {
    check(it->second.is_integer(), "{}: general.alignment must be an integer", what);
    const int64_t a = it->second.as_int("general.alignment");
    check(a > 0 && (a & (a - 1)) == 0 && a <= (int64_t{1} << 30),
          "{}: general.alignment {} is not a power of two", what, a);
    index.alignment = static_cast<uint64_t>(a);
  } else {
    index.alignment = kDefaultAlignment;
  }
  std::set<std::string> names;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo info = read_tensor_info(r, t, what);
    check(names.insert(info.name).second, "{}: tensor \"{}\" appears twice", what, info.name);
    index.tensors.push_back(std::move(info));
  }
  index.data_start = align_up(r.pos(), index.alignment);
  check(index.data_start <= file.size() || index.tensors.empty(),
        "{}: the data section starts at {}, past the end of the file ({} bytes)", what,
        index.data_start, file.size());
  const uint64_t data_size = file.size() > index.data_start ? file.size() - index.data_start : 0;
  for (const GgufTensorInfo& t : index.tensors) {
    check(t.offset % index.alignment == 0, "{}: tensor \"{}\": offset {} is not a multiple of {}",
          what, t.name, t.offset, index.alignment);
    check(t.offset <= data_size && t.bytes <= data_size - t.offset,
          "{}: tensor \"{}\": its {} bytes at offset {} are past the end of the data ({} bytes)",
          what, t.name, t.bytes, t.offset, data_size);
  }
  return index;
}

GgufFile::GgufFile(const std::string& path)
    : path_(path), file_(std::make_unique<MappedFile>(path)) {
  index_ = parse_gguf(file_->bytes(), path);
  for (size_t i = 0; i < index_.tensors.size(); ++i) by_name_[index_.tensors[i].name] = i;
}

GgufFile::~GgufFile() = default;

const GgufValue* GgufFile::value(const std::string& key) const {
  const auto it = index_.metadata.find(key);
  return it == index_.metadata.end() ? nullptr : &it->second;
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  check(it != by_name_.end(), "{}: no tensor named \"{}\"", path_, name);
  return index_.tensors[it->second];
}

std::vector<std::string> GgufFile::names() const {
  std::vector<std::string> out;
  for (const auto& t : index_.tensors) out.push_back(t.name);
  return out;
}

bool GgufFile::contains(const std::string& name) const {
  return by_name_.count(name) != 0;
}

Shape GgufFile::shape(const std::string& name) const {
  return tensor(name).shape();
}

std::string GgufFile::stored_dtype(const std::string& name) const {
  return ggml_type_name(static_cast<uint32_t>(tensor(name).type));
}

void GgufFile::read_f32(const std::string& name, float* dst) const {
  const GgufTensorInfo& t = tensor(name);
  dequantize(t.type, file_->bytes().data() + index_.data_start + t.offset, t.numel(), dst);
}

std::optional<std::string> GgufFile::metadata(const std::string& key) const {
  const GgufValue* v = value(key);
  if (!v || v->type == GgufValueType::array) return std::nullopt;
  if (v->type == GgufValueType::string) return v->s;
  if (v->type == GgufValueType::f32 || v->type == GgufValueType::f64)
    return fmt::format("{}", v->f);
  if (v->type == GgufValueType::u8 || v->type == GgufValueType::u16 ||
      v->type == GgufValueType::u32 || v->type == GgufValueType::u64)
    return std::to_string(v->u);
  return std::to_string(v->i);
}

}  // namespace headlight::io

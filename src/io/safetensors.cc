// safetensors: validation, memory-mapped reading and atomic writing (see the header).

#include "headlight/io/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "src/io/half.h"
#include "src/io/mapped_file.h"

namespace headlight::io {

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // 100 MB, as the format's specification limits it

// Whether bytes form valid UTF-8 (no overlong forms, no surrogates, ≤ U+10FFFF).
bool valid_utf8(std::span<const uint8_t> s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = s[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

uint64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kBytes = {
      {"F64", 8},     {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1},
      {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4}, {"I16", 2},  {"I8", 1},
      {"U64", 8},     {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1}};
  const auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

}  // namespace

namespace {

// The header [8, 8 + n) as JSON: its length checked against the file, valid UTF-8, one object
// whose top-level names are all different. Sets `header_end` to 8 + n.
nlohmann::ordered_json parse_header(std::span<const uint8_t> file, const std::string& what,
                                    uint64_t& header_end) {
  check(file.size() >= 8, "{}: truncated: {} bytes, fewer than the 8 of the header length", what,
        file.size());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];
  check(n <= kMaxHeader, "{}: header length {} exceeds the 100 MB limit", what, n);
  check(n <= file.size() - 8, "{}: header length {} is past the end of the file ({} bytes)", what,
        n, file.size());
  const auto header = file.subspan(8, static_cast<size_t>(n));
  check(valid_utf8(header), "{}: the header is not valid UTF-8", what);
  // Duplicate names at the top level are caught while parsing (a JSON object keeps only one).
  std::set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                      nlohmann::ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key && parsed.is_string()) {
      const std::string key = parsed.get<std::string>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(header.begin(), header.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the header is not valid JSON ({})", what, e.what());
  }
  check(duplicate.empty(), "{}: duplicate tensor name \"{}\" in the header", what, duplicate);
  check(j.is_object(), "{}: the header must be a JSON object, got {}", what, j.type_name());
  header_end = 8 + n;
  return j;
}

// One tensor's entry {"dtype", "shape", "data_offsets"}: every field present and of its type, the
// shape's byte count without overflow, the offsets spanning exactly that many bytes inside the
// data.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::ordered_json& v,
                             uint64_t data_size, const std::string& what) {
  check(v.is_object(), "{}: tensor \"{}\": expected an object with dtype, shape, data_offsets",
        what, name);
  check(v.contains("dtype") && v["dtype"].is_string(), "{}: tensor \"{}\": missing dtype", what,
        name);
  SafetensorsEntry e;
  e.name = name;
  e.dtype = v["dtype"].get<std::string>();
  const uint64_t size = dtype_bytes(e.dtype);
  check(size > 0, "{}: tensor \"{}\": unknown dtype \"{}\"", what, name, e.dtype);
  check(v.contains("shape") && v["shape"].is_array(), "{}: tensor \"{}\": missing shape", what,
        name);
  uint64_t bytes = size;
  for (const auto& d : v["shape"]) {
    check(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
          "{}: tensor \"{}\": shape entries must be non-negative integers", what, name);
    const uint64_t extent = d.get<uint64_t>();
    check(extent <= static_cast<uint64_t>(INT64_MAX), "{}: tensor \"{}\": shape overflows", what,
          name);
    e.shape.push_back(static_cast<int64_t>(extent));
    check(extent == 0 || bytes <= UINT64_MAX / extent,
          "{}: tensor \"{}\": shape {} × {} bytes overflows", what, name, v["shape"].dump(), size);
    bytes *= extent;
  }
  check(v.contains("data_offsets") && v["data_offsets"].is_array() &&
            v["data_offsets"].size() == 2 && v["data_offsets"][0].is_number_unsigned() &&
            v["data_offsets"][1].is_number_unsigned(),
        "{}: tensor \"{}\": data_offsets must be two non-negative integers", what, name);
  e.begin = v["data_offsets"][0].get<uint64_t>();
  e.end = v["data_offsets"][1].get<uint64_t>();
  check(e.begin <= e.end, "{}: tensor \"{}\": data_offsets [{}, {}] end before they begin", what,
        name, e.begin, e.end);
  check(e.end - e.begin == bytes,
        "{}: tensor \"{}\": data_offsets span {} bytes, shape {} of {} needs {}", what, name,
        e.end - e.begin, shape_string(e.shape), e.dtype, bytes);
  check(e.end <= data_size,
        "{}: tensor \"{}\": data_offsets end {} is past the end of the data ({} bytes)", what, name,
        e.end, data_size);
  return e;
}

// In header order the data must be laid out back to back: no tensor before the previous one, no
// overlap, no gap, the first at offset 0, nothing after the last.
void check_layout(const SafetensorsIndex& index, uint64_t data_size, const std::string& what) {
  for (size_t i = 1; i < index.tensors.size(); ++i) {
    const SafetensorsEntry &prev = index.tensors[i - 1], &e = index.tensors[i];
    check(e.begin >= prev.begin,
          "{}: tensor \"{}\": data_offsets out of order (begins at {}, before \"{}\" at {})", what,
          e.name, e.begin, prev.name, prev.begin);
    check(e.begin >= prev.end, "{}: tensor \"{}\": data_offsets [{}, {}] overlap \"{}\" [{}, {}]",
          what, e.name, e.begin, e.end, prev.name, prev.begin, prev.end);
    check(e.begin == prev.end, "{}: tensor \"{}\": a gap of {} bytes before its data", what, e.name,
          e.begin - prev.end);
  }
  if (!index.tensors.empty())
    check(index.tensors[0].begin == 0,
          "{}: tensor \"{}\": a gap of {} bytes at the start of the data", what,
          index.tensors[0].name, index.tensors[0].begin);
  const uint64_t used = index.tensors.empty() ? 0 : index.tensors.back().end;
  check(used == data_size, "{}: {} trailing bytes after the last tensor's data", what,
        data_size - used);
}

}  // namespace

SafetensorsIndex parse_safetensors(std::span<const uint8_t> file, const std::string& what) {
  SafetensorsIndex index;
  const nlohmann::ordered_json j = parse_header(file, what, index.data_start);
  const uint64_t data_size = file.size() - index.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      check(v.is_object(), "{}: __metadata__ must be an object of strings", what);
      for (auto m = v.begin(); m != v.end(); ++m) {
        check(m.value().is_string(), "{}: __metadata__ entry \"{}\" is not a string", what,
              m.key());
        index.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    index.tensors.push_back(parse_entry(name, v, data_size, what));
  }
  check_layout(index, data_size, what);
  return index;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : path_(path), file_(std::make_unique<MappedFile>(path)) {
  index_ = parse_safetensors(file_->bytes(), path);
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : index_.tensors) out.push_back(e.name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& e : index_.tensors)
    if (e.name == name) return true;
  return false;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  for (const auto& e : index_.tensors)
    if (e.name == name) return e;
  fail("{}: no tensor named \"{}\"", path_, name);
}

Shape SafetensorsFile::shape(const std::string& name) const {
  return entry(name).shape;
}

std::string SafetensorsFile::stored_dtype(const std::string& name) const {
  return entry(name).dtype;
}

void SafetensorsFile::read_f32(const std::string& name, float* dst) const {
  const SafetensorsEntry& e = entry(name);
  const uint8_t* src = file_->bytes().data() + index_.data_start + e.begin;
  const size_t bytes = static_cast<size_t>(e.end - e.begin);
  if (e.dtype == "F32") {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  if (e.dtype == "F64") {
    for (size_t i = 0; i < bytes / 8; ++i) {
      double x;
      std::memcpy(&x, src + 8 * i, 8);
      dst[i] = static_cast<float>(x);
    }
    return;
  }
  check(e.dtype == "F16" || e.dtype == "BF16",
        "{}: tensor \"{}\" has dtype {}, which headlight does not read as float32 (F32, F16, "
        "BF16 and F64 it does)",
        path_, name, e.dtype);
  const size_t n = bytes / 2;
  const bool bf16 = e.dtype == "BF16";
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = load_u16(src + 2 * i);
    dst[i] = bf16 ? bf16_to_float(h) : half_to_float(h);
  }
}

std::optional<std::string> SafetensorsFile::metadata(const std::string& key) const {
  const auto it = index_.metadata.find(key);
  if (it == index_.metadata.end()) return std::nullopt;
  return it->second;
}

void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    check(names.insert(t.name).second, "{}: duplicate tensor name \"{}\"", path, t.name);
    check(t.name != "__metadata__", "{}: \"__metadata__\" cannot name a tensor", path);
    const uint64_t bytes = static_cast<uint64_t>(checked_numel(t.shape, t.name)) * 4;
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  AtomicFile out(path);
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(len, 8);
  out.write(text);
  for (const TensorToWrite& t : tensors)
    out.write(t.data, static_cast<size_t>(checked_numel(t.shape, t.name)) * 4);
  out.commit();
}

ShardedSafetensors::ShardedSafetensors(const std::string& index_path) : path_(index_path) {
  std::ifstream in(index_path, std::ios::binary);
  check(in.good(), "{}: cannot open", index_path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON ({})", index_path, e.what());
  }
  check(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
        "{}: no \"weight_map\" object", index_path);
  const std::filesystem::path folder = std::filesystem::path(index_path).parent_path();
  std::map<std::string, size_t> shard_index;
  for (const auto& [tensor, shard_json] : j["weight_map"].items()) {
    check(shard_json.is_string(), "{}: weight_map[\"{}\"] must be a file name", index_path, tensor);
    const std::string shard = shard_json.get<std::string>();
    // A shard is a file beside the index: no folders, so that a crafted index reads nothing else.
    check(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
          "{}: weight_map[\"{}\"]: \"{}\" is not a file name beside the index", index_path, tensor,
          shard);
    auto [it, added] = shard_index.emplace(shard, shards_.size());
    if (added) shards_.push_back(std::make_unique<SafetensorsFile>((folder / shard).string()));
    check(shards_[it->second]->contains(tensor),
          "{}: weight_map puts \"{}\" in {}, which has no such tensor", index_path, tensor, shard);
    shard_by_tensor_[tensor] = it->second;
    names_.push_back(tensor);
  }
  check(!names_.empty(), "{}: weight_map is empty", index_path);
  if (j.contains("metadata") && j["metadata"].is_object())
    for (const auto& [key, value] : j["metadata"].items())
      metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
}

ShardedSafetensors::~ShardedSafetensors() = default;

const SafetensorsFile& ShardedSafetensors::shard_of(const std::string& name) const {
  const auto it = shard_by_tensor_.find(name);
  check(it != shard_by_tensor_.end(), "{}: no tensor named \"{}\"", path_, name);
  return *shards_[it->second];
}

std::vector<std::string> ShardedSafetensors::names() const {
  return names_;
}
bool ShardedSafetensors::contains(const std::string& name) const {
  return shard_by_tensor_.count(name) != 0;
}
Shape ShardedSafetensors::shape(const std::string& name) const {
  return shard_of(name).shape(name);
}
void ShardedSafetensors::read_f32(const std::string& name, float* dst) const {
  shard_of(name).read_f32(name, dst);
}
std::string ShardedSafetensors::stored_dtype(const std::string& name) const {
  return shard_of(name).stored_dtype(name);
}
std::optional<std::string> ShardedSafetensors::metadata(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  return it->second;
}

}  // namespace headlight::io

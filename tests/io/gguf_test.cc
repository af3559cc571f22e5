// The GGUF reader on files built byte by byte: what it reads (metadata of every type, shapes in
// PyTorch order, dequantised blocks with known values), and every crafted count, size, offset and
// type the format's validation must refuse, each with its own message. Every prefix of a valid file
// is refused cleanly (the fuzz target in fuzz/ covers the rest). The bit-for-bit comparison with
// the gguf package's dequantisers is python/tests/test_gguf.py.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "headlight/io/gguf.h"
#include "test_util.h"

namespace headlight::io {
namespace {

using testing::expect_error;

// Writes a GGUF file field by field.
struct Builder {
  std::vector<uint8_t> b;
  template <typename T>
  Builder& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put(version).put(tensors).put(kvs);
  }
  Builder& key(const std::string& k, GgufValueType t) {
    return str(k).put(static_cast<uint32_t>(t));
  }
  Builder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  uint64_t offset) {
    str(name).put(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put(d);
    return put(type).put(offset);
  }
  Builder& pad(size_t alignment = 32) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  GgufIndex parse() const { return parse_gguf(b, "f.gguf"); }
};

uint16_t half(float x) {  // exact for the values used here (small integers and halves)
  if (x == 0) return 0;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int exp = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3FF));
}

// A file with two tensors: "w" F32 [2, 3] (ne {3, 2}) holding 0..5, and "q" Q8_0 [1, 32] with
// scale 0.5 and values −16..15.
Builder valid_file() {
  Builder f;
  f.header(2, 3);
  f.key("general.architecture", GgufValueType::string).str("llama");
  f.key("n", GgufValueType::u32).put<uint32_t>(7);
  f.key("list", GgufValueType::array)
      .put(static_cast<uint32_t>(GgufValueType::i16))
      .put<uint64_t>(2);
  f.put<int16_t>(-3).put<int16_t>(4);
  f.tensor("w", {3, 2}, 0, 0).tensor("q", {32, 1}, 8, 32).pad();
  for (int i = 0; i < 6; ++i) f.put(static_cast<float>(i));
  f.pad();
  f.put(half(0.5f));
  for (int i = 0; i < 32; ++i) f.put(static_cast<int8_t>(i - 16));
  return f;
}

TEST(Gguf, ReadsMetadataShapesAndValues) {
  const Builder f = valid_file();
  const GgufIndex idx = f.parse();
  EXPECT_EQ(idx.version, 3u);
  EXPECT_EQ(idx.metadata.at("general.architecture").s, "llama");
  EXPECT_EQ(idx.metadata.at("n").as_int("n"), 7);
  const GgufValue& list = idx.metadata.at("list");
  ASSERT_EQ(list.items.size(), 2u);
  EXPECT_EQ(list.items[0].i, -3);
  EXPECT_EQ(list.items[1].i, 4);
  ASSERT_EQ(idx.tensors.size(), 2u);
  EXPECT_EQ(idx.tensors[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(idx.tensors[1].shape(), (Shape{1, 32}));
  std::vector<float> w(6), q(32);
  dequantize(idx.tensors[0].type, f.b.data() + idx.data_start + idx.tensors[0].offset, 6, w.data());
  dequantize(idx.tensors[1].type, f.b.data() + idx.data_start + idx.tensors[1].offset, 32,
             q.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w[i], static_cast<float>(i));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], 0.5f * static_cast<float>(i - 16));
}

TEST(Gguf, Q4BlocksHoldTheirNibblesInOrder) {
  // Q4_0: 16 bytes of nibbles, element e < 16 the low nibble of byte e, e ≥ 16 the high one.
  std::vector<uint8_t> blk(18);
  const uint16_t d = half(2.0f);
  std::memcpy(blk.data(), &d, 2);
  for (int e = 0; e < 16; ++e) blk[2 + e] = static_cast<uint8_t>(e | ((15 - e) << 4));
  std::vector<float> y(32);
  dequantize(GgmlType::q4_0, blk.data(), 32, y.data());
  for (int e = 0; e < 16; ++e) {
    EXPECT_EQ(y[e], 2.0f * static_cast<float>(e - 8));
    EXPECT_EQ(y[16 + e], 2.0f * static_cast<float>(15 - e - 8));
  }
}

TEST(Gguf, EveryPrefixOfAValidFileIsRefused) {
  const Builder f = valid_file();
  const size_t data_end = f.b.size();
  for (size_t n = 0; n < data_end; ++n) {
    const std::vector<uint8_t> cut(f.b.begin(), f.b.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_gguf(cut, "f.gguf"), Error) << "prefix of " << n << " bytes";
  }
}

TEST(Gguf, RefusesBadHeaders) {
  expect_error([] { Builder().put<uint32_t>(0x4C4D4747).parse(); }, {"f.gguf", "not a GGUF"});
  expect_error([] { Builder().header(0, 0, 1).parse(); }, {"version 1"});
  expect_error([] { Builder().header(uint64_t{1} << 60, 0).parse(); }, {"tensors cannot fit"});
  expect_error([] { Builder().header(0, uint64_t{1} << 60).parse(); },
               {"metadata entries cannot fit"});
}

TEST(Gguf, RefusesCraftedMetadata) {
  {  // a key longer than the file
    Builder f;
    f.header(0, 1).put<uint64_t>(uint64_t{1} << 62);
    f.b.resize(f.b.size() + 16, 0);
    expect_error([&] { f.parse(); }, {"metadata key 0", "past the end"});
  }
  {
    Builder f;
    f.header(0, 1).key("k", static_cast<GgufValueType>(13));
    expect_error([&] { f.parse(); }, {"\"k\"", "unknown value type 13"});
  }
  {
    Builder f;
    f.header(0, 1).key("b", GgufValueType::boolean).put<uint8_t>(2);
    expect_error([&] { f.parse(); }, {"\"b\"", "0 or 1"});
  }
  {  // an array whose count the file cannot hold
    Builder f;
    f.header(0, 1).key("a", GgufValueType::array).put(static_cast<uint32_t>(GgufValueType::u64));
    f.put<uint64_t>(uint64_t{1} << 59);
    expect_error([&] { f.parse(); }, {"\"a\"", "cannot fit"});
  }
  {  // arrays nested too deep
    Builder f;
    f.header(0, 1).key("deep", GgufValueType::array);
    for (int i = 0; i < 20; ++i)
      f.put(static_cast<uint32_t>(GgufValueType::array)).put<uint64_t>(1);
    f.put(static_cast<uint32_t>(GgufValueType::u8)).put<uint64_t>(1).put<uint8_t>(1);
    expect_error([&] { f.parse(); }, {"\"deep\"", "nested deeper"});
  }
  {
    Builder f;
    f.header(0, 2).key("k", GgufValueType::u8).put<uint8_t>(1).key("k", GgufValueType::u8);
    f.put<uint8_t>(2);
    expect_error([&] { f.parse(); }, {"\"k\" appears twice"});
  }
  {
    Builder f;
    f.header(0, 1).key("general.alignment", GgufValueType::u32).put<uint32_t>(24);
    expect_error([&] { f.parse(); }, {"alignment 24", "power of two"});
  }
}

TEST(Gguf, RefusesCraftedTensors) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data) {
    Builder f;
    f.header(1, 0).tensor("t", std::move(ne), type, offset).pad();
    f.b.resize(f.b.size() + data, 0);
    return f;
  };
  expect_error([&] { one({1, 1, 1, 1, 1}, 0, 0, 4).parse(); }, {"\"t\"", "5 dimensions"});
  expect_error(
      [&] {
        one({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 4).parse();
      },
      {"\"t\"", "overflow"});
  expect_error([&] { one({32}, 6, 0, 22).parse(); }, {"\"t\"", "Q5_0", "not supported"});
  expect_error([&] { one({32}, 99, 0, 22).parse(); }, {"type 99", "not supported"});
  expect_error([&] { one({33}, 8, 0, 68).parse(); }, {"\"t\"", "not whole Q8_0 blocks"});
  expect_error([&] { one({4}, 0, 8, 64).parse(); }, {"\"t\"", "offset 8", "multiple of 32"});
  expect_error([&] { one({4}, 0, 0, 15).parse(); }, {"\"t\"", "past the end of the data"});
  expect_error([&] { one({4}, 0, uint64_t{1} << 63, 16).parse(); }, {"past the end"});
  {
    Builder f;
    f.header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad();
    f.b.resize(f.b.size() + 64, 0);
    expect_error([&] { f.parse(); }, {"tensor \"t\" appears twice"});
  }
}

TEST(Gguf, FileAsTensorSource) {
  const Builder f = valid_file();
  const std::string path =
      (std::filesystem::temp_directory_path() / "headlight_test.gguf").string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(f.b.data()), static_cast<std::streamsize>(f.b.size()));
  }
  const GgufFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"w", "q"}));
  EXPECT_EQ(file.shape("w"), (Shape{2, 3}));
  std::vector<float> q(32);
  file.read_f32("q", q.data());
  EXPECT_EQ(q[31], 0.5f * 15);
  EXPECT_EQ(file.metadata("general.architecture"), "llama");
  EXPECT_EQ(file.metadata("n"), "7");
  EXPECT_FALSE(file.metadata("list").has_value());
  expect_error([&] { file.shape("missing"); }, {path.c_str(), "no tensor named \"missing\""});
  expect_error([] { GgufFile("/nonexistent/x.gguf"); }, {"/nonexistent/x.gguf", "cannot open"});
}

}  // namespace
}  // namespace headlight::io

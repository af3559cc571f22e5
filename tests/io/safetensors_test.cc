// The safetensors reader and writer: round trips, F16/BF16 conversion, and every malformed file the
// format's specification rules out, each with its specific error.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "headlight/io/safetensors.h"
#include "test_util.h"

namespace headlight::io {
namespace {

using testing::expect_error;

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  if (n > 0) std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

SafetensorsIndex parse(const std::string& header, size_t data_bytes) {
  const auto bytes = file_bytes(header, data_bytes);
  return parse_safetensors(bytes, "f");
}

TEST(Safetensors, WritesAndReadsBack) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "headlight_st_test.safetensors").string();
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  const std::vector<TensorToWrite> tensors = {{"a", {2, 3}, a.data()}, {"b.x", {1}, b.data()}};
  write_safetensors(path, tensors, {{"k", "v"}});
  const SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b.x"}));
  EXPECT_EQ(f.shape("a"), (Shape{2, 3}));
  std::vector<float> got(6);
  f.read_f32("a", got.data());
  EXPECT_EQ(got, a);
  EXPECT_EQ(f.metadata("k").value(), "v");
  EXPECT_FALSE(f.metadata("absent").has_value());
  // The header is padded so that the data starts 8-byte aligned.
  EXPECT_EQ(f.index().data_start % 8, 0u);
  // No temporary file is left beside it.
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
    EXPECT_EQ(e.path().filename().string().find(".headlight_st_test.safetensors.tmp"),
              std::string::npos);
  std::filesystem::remove(path);
}

TEST(Safetensors, FailedWriteLeavesNothing) {
  const std::vector<float> a = {1};
  const std::vector<TensorToWrite> tensors = {{"a", {1}, a.data()}};
  expect_error([&] { write_safetensors("/nonexistent-dir/x.safetensors", tensors, {}); },
               {"/nonexistent-dir/x.safetensors", "temporary"});
  const std::vector<TensorToWrite> dup = {{"a", {1}, a.data()}, {"a", {1}, a.data()}};
  const std::string path = (std::filesystem::temp_directory_path() / "hl_dup.safetensors").string();
  expect_error([&] { write_safetensors(path, dup, {}); }, {"duplicate tensor name"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, ConvertsHalfAndBfloat16) {
  // F16: 1.0 = 0x3C00, −2.5 = 0xC100, 2^-24 (subnormal) = 0x0001. BF16: 1.0 = 0x3F80.
  std::string header =
      R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[6,8]}})";
  auto bytes = file_bytes(header, 8);
  const size_t d = 8 + header.size();
  const uint16_t vals[4] = {0x3C00, 0xC100, 0x0001, 0x3F80};
  std::memcpy(bytes.data() + d, vals, 8);
  const std::string path =
      (std::filesystem::temp_directory_path() / "hl_half.safetensors").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const SafetensorsFile f(path);
  float h[3], b[1];
  f.read_f32("h", h);
  f.read_f32("b", b);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.5f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(b[0], 1.0f);
  std::filesystem::remove(path);
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string t = R"("dtype":"F32","shape":[2])";
  // Truncated: fewer than 8 bytes.
  expect_error([] { parse_safetensors(std::vector<uint8_t>{1, 2, 3}, "f"); }, {"truncated"});
  // Header length past the end of the file.
  {
    auto bytes = file_bytes("{}", 0);
    bytes[0] = 200;
    expect_error([&] { parse_safetensors(bytes, "f"); }, {"past the end of the file"});
  }
  // Header length over 100 MB.
  {
    auto bytes = file_bytes("{}", 0);
    bytes[4] = 1;  // 2^32 + 2
    expect_error([&] { parse_safetensors(bytes, "f"); }, {"100 MB"});
  }
  expect_error([] { parse("{\"a\": ", 0); }, {"not valid JSON"});
  expect_error([] { parse("[1, 2]", 0); }, {"must be a JSON object"});
  expect_error([] { parse("{\"\xff\xfe\": 1}", 0); }, {"not valid UTF-8"});
  expect_error([] { parse(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,8]}})", 8); },
               {"unknown dtype \"Q4\""});
  EXPECT_EQ(
      parse(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8).tensors[0].dtype,
      "I64");
  expect_error(
      [] {
        parse(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8);
      },
      {"overflows"});
  expect_error([] { parse(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0); },
               {"non-negative"});
  expect_error([&] { parse(R"({"a":{)" + t + R"(,"data_offsets":[0,12]}})", 12); },
               {"span 12 bytes", "needs 8"});
  expect_error(
      [&] {
        parse(
            R"({"a":{)" + t + R"(,"data_offsets":[0,8]},"b":{)" + t + R"(,"data_offsets":[4,12]}})",
            12);
      },
      {"overlap"});
  expect_error(
      [&] {
        parse(
            R"({"a":{)" + t + R"(,"data_offsets":[8,16]},"b":{)" + t + R"(,"data_offsets":[0,8]}})",
            16);
      },
      {"out of order"});
  expect_error(
      [&] {
        parse(R"({"a":{)" + t + R"(,"data_offsets":[0,8]},"b":{)" + t +
                  R"(,"data_offsets":[12,20]}})",
              20);
      },
      {"gap of 4 bytes"});
  expect_error([&] { parse(R"({"a":{)" + t + R"(,"data_offsets":[4,12]}})", 12); },
               {"gap of 4 bytes at the start"});
  expect_error([&] { parse(R"({"a":{)" + t + R"(,"data_offsets":[0,8]}})", 4); },
               {"past the end of the data"});
  expect_error([&] { parse(R"({"a":{)" + t + R"(,"data_offsets":[0,8]}})", 10); },
               {"2 trailing bytes"});
  expect_error(
      [&] {
        parse(
            R"({"a":{)" + t + R"(,"data_offsets":[0,8]},"a":{)" + t + R"(,"data_offsets":[8,16]}})",
            16);
      },
      {"duplicate tensor name \"a\""});
  expect_error([] { parse(R"({"__metadata__":{"k":1}})", 0); }, {"not a string"});
  expect_error([] { parse(R"({"a":{"dtype":"F32","shape":[1]}})", 4); }, {"data_offsets"});
  // A valid file with a padded header and an empty tensor parses.
  const auto ok = parse(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{)" + t +
                            R"(,"data_offsets":[0,8]}}   )",
                        8);
  EXPECT_EQ(ok.tensors.size(), 2u);
}

TEST(Safetensors, MissingFileNamesThePath) {
  expect_error([] { SafetensorsFile f("/no/such/file.safetensors"); },
               {"/no/such/file.safetensors", "cannot open"});
}

TEST(Safetensors, ShardsNamedByAnIndex) {
  const auto dir = std::filesystem::temp_directory_path() / "headlight_shards";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  write_safetensors((dir / "model-1.safetensors").string(),
                    std::vector<TensorToWrite>{{"a", {3}, a.data()}}, {});
  write_safetensors((dir / "model-2.safetensors").string(),
                    std::vector<TensorToWrite>{{"b", {1, 2}, b.data()}}, {});
  auto write_index = [&](const std::string& text) {
    std::ofstream(dir / "model.safetensors.index.json") << text;
    return (dir / "model.safetensors.index.json").string();
  };
  const std::string index = write_index(
      R"({"metadata": {"total_size": 20}, "weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})");
  const ShardedSafetensors s(index);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.shape("b"), (Shape{1, 2}));
  std::vector<float> got(2);
  s.read_f32("b", got.data());
  EXPECT_EQ(got, b);
  EXPECT_EQ(s.metadata("total_size"), "20");
  expect_error(
      [&] { ShardedSafetensors(write_index(R"({"weight_map": {"a": "model-2.safetensors"}})")); },
      {"model.safetensors.index.json", "\"a\"", "no such tensor"});
  expect_error(
      [&] { ShardedSafetensors(write_index(R"({"weight_map": {"a": "../x.safetensors"}})")); },
      {"not a file name beside the index"});
  expect_error(
      [&] { ShardedSafetensors(write_index(R"({"weight_map": {"a": "missing.safetensors"}})")); },
      {"missing.safetensors", "cannot open"});
  expect_error([&] { ShardedSafetensors(write_index(R"({"metadata": {}})")); }, {"weight_map"});
}

TEST(Safetensors, OtherDtypesParseAndOnlyFloatsConvert) {
  const auto path = std::filesystem::temp_directory_path() / "headlight_i64.safetensors";
  const auto bytes = file_bytes(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const SafetensorsFile f(path.string());
  float x;
  expect_error([&] { f.read_f32("ids", &x); }, {"\"ids\"", "I64", "does not read as float32"});
}

}  // namespace
}  // namespace headlight::io

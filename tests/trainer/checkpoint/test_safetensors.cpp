// The safetensors writer and reader (trainer/checkpoint/safetensors.h) against Hugging Face's safetensors
// library both ways (tests/trainer/checkpoint/safetensors_oracle.py), and the reader's validation of
// malformed files: every error names the file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/dtype_convert.h"
#include "trainer/checkpoint/safetensors.h"

namespace llmtrain::trainer {
namespace {

using kernels::DType;
namespace fs = std::filesystem;

struct EntrySpec {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;
};
// The same list as safetensors_oracle.py's ENTRIES.
const std::vector<EntrySpec> kEntries = {
    {"a.f32", DType::fp32, {2, 3, 4}}, {"b.bf16", DType::bf16, {5, 7}},  {"c.f16", DType::fp16, {3, 11}},
    {"d.i32", DType::int32, {4}},      {"e.u16", DType::uint16, {6}},    {"f.i64", DType::int64, {2, 2}},
    {"g.u8", DType::uint8, {9}},       {"h.empty", DType::fp32, {0, 4}}, {"i.scalar", DType::fp32, {}},
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The oracle's formula, as bytes of the entry's dtype.
std::vector<uint8_t> expected_bytes(size_t i, const EntrySpec& e) {
  const int64_t n = numel(e.shape);
  std::vector<uint8_t> out(size_t(n) * kernels::dtype_size(e.dtype));
  for (int64_t j = 0; j < n; ++j) {
    const float f = float(double(j % 17 - 8) * 0.3 * double(i + 1));
    const int64_t v = j * int64_t(i + 1) - 5;
    void* dst = out.data() + size_t(j) * kernels::dtype_size(e.dtype);
    switch (e.dtype) {
      case DType::fp32:
        std::memcpy(dst, &f, 4);
        break;
      case DType::bf16: {
        const uint16_t h = kernels::fp32_to_bf16(f);
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::fp16: {
        const uint16_t h = kernels::fp32_to_fp16(f);
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::int32: {
        const int32_t x = int32_t(v);
        std::memcpy(dst, &x, 4);
        break;
      }
      case DType::uint16: {
        const uint16_t x = uint16_t(v);
        std::memcpy(dst, &x, 2);
        break;
      }
      case DType::int64:
        std::memcpy(dst, &v, 8);
        break;
      case DType::uint8:
        *static_cast<uint8_t*>(dst) = uint8_t(v);
        break;
    }
  }
  return out;
}

std::string python() { return std::string(LLMTRAIN_SOURCE_DIR) + "/.venv/bin/python"; }
std::string oracle() { return std::string(LLMTRAIN_SOURCE_DIR) + "/tests/trainer/checkpoint/safetensors_oracle.py"; }

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("llmtrain-st-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  // A file with an 8-byte little-endian header length, the header, then `data`.
  std::string file_bytes(const std::string& header, const std::string& data, uint64_t claimed = ~uint64_t(0)) const {
    const uint64_t n = claimed == ~uint64_t(0) ? header.size() : claimed;
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return out + header + data;
  }
  void expect_error(const std::string& name, const std::string& bytes, const std::string& what) {
    write_raw(name, bytes);
    try {
      SafetensorsFile f(path(name));
      ADD_FAILURE() << name << ": expected an error containing \"" << what << "\"";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path(name)), std::string::npos) << "the error must name the file: " << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }
  fs::path dir_;
};

TEST_F(Safetensors, OurFilesLoadInHuggingFacesLibrary) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < kEntries.size(); ++i) data.push_back(expected_bytes(i, kEntries[i]));
  for (size_t i = 0; i < kEntries.size(); ++i)
    entries.push_back({kEntries[i].name, kEntries[i].dtype, kEntries[i].shape, data[i].data()});
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"writer", "llmtrain"}};
  std::string bytes;
  safetensors_write(entries, meta, [&](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); });
  EXPECT_EQ(bytes.size(), safetensors_size(entries, meta));
  write_raw("ours.safetensors", bytes);
  const std::string cmd = python() + " " + oracle() + " check " + path("ours.safetensors");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  // Our reader reads back what our writer wrote, byte ranges included.
  SafetensorsFile f(path("ours.safetensors"));
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), kEntries.size());
  const SafetensorsTensor& a = f.at("a.f32");
  std::vector<uint8_t> slice(40);
  f.read(a, 8, 40, slice.data());
  EXPECT_EQ(0, std::memcmp(slice.data(), data[0].data() + 8, 40));
}

TEST_F(Safetensors, HuggingFacesFilesLoadInOurReader) {
  const std::string cmd = python() + " " + oracle() + " write " + dir_.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsFile np(path("numpy.safetensors"));
  EXPECT_EQ(np.metadata().at("source"), "safetensors.numpy");
  for (size_t i = 0; i < kEntries.size(); ++i) {
    const EntrySpec& e = kEntries[i];
    if (e.dtype == DType::bf16) continue;
    SCOPED_TRACE(e.name);
    const SafetensorsTensor& t = np.at(e.name);
    EXPECT_EQ(t.dtype, e.dtype);
    EXPECT_EQ(t.shape, e.shape);
    std::vector<uint8_t> got(t.bytes());
    np.read(t, got.data());
    EXPECT_EQ(got, expected_bytes(i, e));
  }
  SafetensorsFile pt(path("torch.safetensors"));
  EXPECT_TRUE(pt.metadata().empty() || pt.metadata().count("format"));
  const SafetensorsTensor& b = pt.at("b.bf16");
  EXPECT_EQ(b.dtype, DType::bf16);
  std::vector<uint8_t> got(b.bytes());
  pt.read(b, got.data());
  EXPECT_EQ(got, expected_bytes(1, kEntries[1])) << "torch's bf16 rounding and ours agree";
  const SafetensorsTensor& x = pt.at("x.f32");
  float last = 0;
  pt.read(x, 5 * 4, 4, &last);  // a range: the last element only
  EXPECT_EQ(last, 5.0f);
  EXPECT_EQ(pt.find("missing"), nullptr);
  EXPECT_THROW(pt.at("missing"), Error);
}

TEST_F(Safetensors, MalformedFilesAreRejectedNamingTheFile) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_error("short", "abc", "shorter than the 8-byte header length");
  expect_error("truncated_header", file_bytes(ok, std::string(8, '\0'), 4096), "truncated: header length 4096");
  expect_error("huge_header", file_bytes("", "", uint64_t(1) << 40), "exceeds the format's limit");
  expect_error("bad_json", file_bytes("{\"t\": [", ""), "not valid JSON");
  expect_error("not_object", file_bytes("[1, 2]", ""), "not a JSON object");
  // Found by fuzz_safetensors: a number too large for a double is nlohmann's out_of_range, not a
  // parse_error, and escaped as an uncaught exception.
  expect_error("number_overflow", file_bytes(R"({"__metadata__": 1e1111111151})", ""), "not valid JSON");
  expect_error("truncated_data", file_bytes(ok, std::string(4, '\0')), "outside the 4 data bytes");
  expect_error("wrong_size",
               file_bytes(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
               "needs 12");
  expect_error("bad_dtype",
               file_bytes(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
               "dtype F64");
  expect_error("negative_shape",
               file_bytes(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
               "non-integer or negative");
  // Issue 33: a shape whose element count wraps 64 bits (2^32 × 2^32, as uint64 0) was taken as an
  // empty tensor; [2^64 - 1] was read as -1. Both are refused.
  expect_error("wrapping_shape",
               file_bytes(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
               "more elements than 64 bits can count");
  expect_error("wrapping_bytes",
               file_bytes(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""),
               "more elements than 64 bits can count");
  expect_error("dimension_past_int64",
               file_bytes(R"({"t":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", ""),
               "beyond 2^63");
  expect_error("missing_key", file_bytes(R"({"t":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')),
               "needs dtype, shape and data_offsets");
  expect_error("overlap",
               file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          std::string(8, '\0')),
               "tensors must tile the data");
  expect_error("trailing_bytes", file_bytes(ok, std::string(12, '\0')), "cover 8 of the 12 data bytes");
  expect_error("bad_metadata", file_bytes(R"({"__metadata__":{"k":3}})", ""), "is not a string");
  // A million '[' would overflow the stack inside the JSON parser (SIGSEGV), not be an error.
  expect_error("deep_header", file_bytes(std::string(1000000, '[') + std::string(1000000, ']'), ""),
               "JSON nested deeper than 64 levels");
  // A pipe where a shard should be: refused at once, not an open that blocks forever.
  const std::string fifo = path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    SafetensorsFile f(fifo);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  try {
    SafetensorsFile f(path("does_not_exist"));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does_not_exist"), std::string::npos);
  }
}

}  // namespace
}  // namespace llmtrain::trainer

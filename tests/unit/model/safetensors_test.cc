#include "engine/model/formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>

namespace inferd {
namespace {

std::string WriteFile(const std::string& name, const std::string& header, size_t data_bytes, int64_t header_len = -1) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(data_bytes, '\x01');
  return path;
}

TEST(Safetensors, ReadsAValidFile) {
  const auto path = WriteFile(
      "ok.safetensors", R"({"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}, "__metadata__": {}})", 12);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const TensorInfo& t = (*f)->tensors().at("a");
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ((*f)->Bytes(t).size(), 12u);
}

struct Bad {
  const char* name;
  std::string header;
  size_t data_bytes;
  int64_t header_len;
  const char* must_mention;
};

class SafetensorsErrors : public ::testing::TestWithParam<Bad> {};

TEST_P(SafetensorsErrors, AreRefusedWithAClearMessage) {
  const Bad& b = GetParam();
  auto f = SafetensorsFile::Open(WriteFile(std::string(b.name) + ".safetensors", b.header, b.data_bytes, b.header_len));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(b.must_mention), std::string::npos) << f.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    All, SafetensorsErrors,
    ::testing::Values(
        Bad{"truncated", R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8, -1, "truncated"},
        Bad{"size_mismatch", R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}})", 8, -1, "need 16"},
        Bad{"huge_header", "{}", 0, int64_t{1} << 40, "header length"},
        Bad{"header_past_end", "{}", 0, 4096, "header length"}, Bad{"not_json", "{nope", 0, -1, "not a JSON object"},
        Bad{"bad_dtype", R"({"a": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]}})", 1, -1, "I8"},
        Bad{"dim_overflow", R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0,
            -1, "overflow"},
        Bad{"negative_dim", R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", 0, -1, "negative"},
        Bad{"reversed_offsets", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, -1, "outside"},
        Bad{"overlapping", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            12, -1, "overlap"},
        Bad{"length_2_63", "{}", 0, int64_t{1} << 62, "header length"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Safetensors, HalfAndBfloat16Conversion) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 5.9604644775390625e-08f);  // smallest subnormal
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xc0a0), -5.0f);
}

}  // namespace
}  // namespace inferd

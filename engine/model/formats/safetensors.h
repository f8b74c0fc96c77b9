// Reader for the safetensors format: an 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets: [begin, end]}}, then the raw tensor bytes. Every length, offset and
// shape is checked against the file before use.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd {

enum class DType { kF32, kF16, kBF16, kF8E4M3 };
const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

struct TensorInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
  int64_t numel() const;
};

// Parses the header of a safetensors file of file_size bytes; header_bytes is the JSON text.
absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensorsHeader(std::string_view header_bytes,
                                                                         uint64_t data_size);

// Parses a whole safetensors file held in memory: the header length, then the header. For the fuzz target.
absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensors(std::span<const uint8_t> file);

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  std::span<const uint8_t> Bytes(const TensorInfo& info) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
};

// Converts stored elements to fp32 (F8_E4M3: the e4m3 value, before any scale).
void ConvertToF32(DType dtype, std::span<const uint8_t> bytes, float* out);
float E4m3ToFloat(uint8_t v);
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t b);

}  // namespace inferd

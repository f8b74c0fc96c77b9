// Reader for GGUF v2/v3 files: a header, typed metadata, tensor infos, then aligned tensor data.
// Every count, length, offset and dimension is checked against the bytes that remain and for overflow
// before anything is allocated or read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* GgufTypeName(GgufType t);

// One metadata value. Integers of every width and bools are kept in `i` (u64 values above INT64_MAX also
// in `u`). Arrays keep their elements compactly by kind: integers and bools in `ints`, floats in
// `floats`, strings in `strings`, nested arrays in `arrays`.
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  GgufType elem_type = GgufType::kU8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;

  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufType::kF32 || type == GgufType::kF64; }
};

// ggml tensor element types that inferd reads (dequantized to fp32 at load).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
  kBF16 = 30,
};
// Name of a ggml type id ("Q4_K"); "type N" for ids inferd does not read.
std::string GgmlTypeName(uint32_t type);
// Elements per block and bytes per block; false for types inferd does not read.
bool GgmlBlockLayout(uint32_t type, int64_t* block_elems, int64_t* block_bytes);

struct GgufTensor {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) one
  uint64_t offset = 0;        // into the data section
  uint64_t size = 0;          // bytes
  int64_t numel = 0;
};

// The parsed structure of a GGUF file over bytes owned elsewhere.
struct GgufContents {
  uint32_t version = 0;
  uint64_t alignment = 32;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;  // file order
  std::map<std::string, size_t> tensor_index;
  uint64_t data_offset = 0;  // where the data section starts in the file

  const GgufValue* Find(std::string_view key) const;
  const GgufTensor* FindTensor(std::string_view name) const;
};

// Parses a whole GGUF file held in memory. Used by GgufFile and by the fuzz target.
absl::StatusOr<GgufContents> ParseGguf(std::span<const uint8_t> file);

class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const GgufContents& contents() const { return contents_; }
  std::span<const uint8_t> Bytes(const GgufTensor& t) const;
  const std::string& path() const { return path_; }

 private:
  GgufFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  GgufContents contents_;
};

// Dequantizes `numel` elements of a ggml type to fp32; `bytes` must hold exactly their blocks.
absl::Status DequantizeGgml(uint32_t type, std::span<const uint8_t> bytes, int64_t numel, float* out);

}  // namespace inferd

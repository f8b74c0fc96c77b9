// Writes GGUF bytes field by field, so tests can make well-formed files and every kind of broken one.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace inferd::testing {

class GgufBuilder {
 public:
  std::vector<uint8_t> bytes;

  GgufBuilder& U32(uint32_t v) { return Raw(&v, 4); }
  GgufBuilder& U64(uint64_t v) { return Raw(&v, 8); }
  GgufBuilder& F32(float v) { return Raw(&v, 4); }
  GgufBuilder& U8(uint8_t v) { return Raw(&v, 1); }
  GgufBuilder& Str(const std::string& s) {
    U64(s.size());
    return Raw(s.data(), s.size());
  }
  GgufBuilder& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    Raw("GGUF", 4);
    return U32(version).U64(n_tensors).U64(n_kv);
  }
  // Metadata entries: key, type, value.
  GgufBuilder& KvU32(const std::string& key, uint32_t v) { return Str(key).U32(4).U32(v); }
  GgufBuilder& KvF32(const std::string& key, float v) { return Str(key).U32(6).F32(v); }
  GgufBuilder& KvStr(const std::string& key, const std::string& v) { return Str(key).U32(8).Str(v); }
  GgufBuilder& KvStrings(const std::string& key, const std::vector<std::string>& v) {
    Str(key).U32(9).U32(8).U64(v.size());
    for (const auto& s : v) Str(s);
    return *this;
  }
  // A tensor info: name, dims (innermost first), ggml type, offset in the data section.
  GgufBuilder& Tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  GgufBuilder& Align(size_t alignment = 32) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  GgufBuilder& Zeros(size_t n) {
    bytes.insert(bytes.end(), n, 0);
    return *this;
  }
  GgufBuilder& Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
    return *this;
  }
};

}  // namespace inferd::testing

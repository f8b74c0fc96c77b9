#include "engine/model/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace inferd {

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF8E4M3:
      return "float8_e4m3";
  }
  return "?";
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kF32:
      return 4;
    case DType::kF8E4M3:
      return 1;
    default:
      return 2;
  }
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensorsHeader(std::string_view header, uint64_t data_size) {
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("safetensors: header is not a JSON object");
  std::map<std::string, TensorInfo> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const nlohmann::json& t = it.value();
    auto bad = [&name](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': ", why));
    };
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return bad("needs dtype, shape and data_offsets [begin, end]");
    }
    TensorInfo info;
    const std::string dtype = t["dtype"].get<std::string>();
    if (dtype == "F32")
      info.dtype = DType::kF32;
    else if (dtype == "F16")
      info.dtype = DType::kF16;
    else if (dtype == "BF16")
      info.dtype = DType::kBF16;
    else if (dtype == "F8_E4M3")
      info.dtype = DType::kF8E4M3;
    else
      return bad(absl::StrCat("dtype '", dtype, "' is not supported; supported: F32, F16, BF16, F8_E4M3"));
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        return bad("shape has a non-integer or negative dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim / 4)) {
        return bad("shape overflows");
      }
      numel *= dim;
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : t["data_offsets"]) {
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        return bad("data_offsets are not non-negative integers");
    }
    info.begin = t["data_offsets"][0].get<uint64_t>();
    info.end = t["data_offsets"][1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size) {
      return bad(absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] lie outside the data section of ",
                              data_size, " bytes (truncated file?)"));
    }
    if (info.end - info.begin != numel * DTypeSize(info.dtype)) {
      return bad(absl::StrCat("holds ", info.end - info.begin, " bytes but its shape and dtype need ",
                              numel * DTypeSize(info.dtype)));
    }
    out.emplace(name, std::move(info));
  }
  std::vector<std::pair<uint64_t, const std::string*>> spans;
  for (const auto& [name, info] : out) {
    if (info.end > info.begin) spans.emplace_back(info.begin, &name);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    if (out.at(*spans[k - 1].second).end > spans[k].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensors '", *spans[k - 1].second, "' and '", *spans[k].second, "' overlap"));
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, TensorInfo>> ParseSafetensors(std::span<const uint8_t> file) {
  if (file.size() < 8)
    return absl::InvalidArgumentError(absl::StrCat(file.size(), " bytes is too short for safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > kMaxHeaderBytes || header_len > file.size() - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_len, " exceeds the file size or the ", kMaxHeaderBytes, "-byte limit"));
  }
  return ParseSafetensorsHeader(std::string_view(reinterpret_cast<const char*>(file.data() + 8), header_len),
                                file.size() - 8 - header_len);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat '", path, "'"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", size, " bytes is too short for safetensors"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot map '", path, "'"));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = static_cast<const uint8_t*>(map);
  f->map_size_ = size;
  auto tensors = ParseSafetensors({f->map_, f->map_size_});
  if (!tensors.ok()) return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", tensors.status().message()));
  uint64_t header_len = 0;
  std::memcpy(&header_len, f->map_, 8);
  f->tensors_ = std::move(*tensors);
  f->data_ = f->map_ + 8 + header_len;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
}

std::span<const uint8_t> SafetensorsFile::Bytes(const TensorInfo& info) const {
  return {data_ + info.begin, static_cast<size_t>(info.end - info.begin)};
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// e4m3 "fn": 4 exponent bits of bias 7, 3 mantissa bits, no infinities; 0x7F and 0xFF are NaN.
float E4m3ToFloat(uint8_t v) {
  const int exp = (v >> 3) & 15, man = v & 7;
  float f;
  if (exp == 15 && man == 7) {
    f = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -9);
  } else {
    f = std::ldexp(1.f + man / 8.f, exp - 7);
  }
  return (v & 0x80) ? -f : f;
}

void ConvertToF32(DType dtype, std::span<const uint8_t> bytes, float* out) {
  const size_t n = bytes.size() / DTypeSize(dtype);
  if (dtype == DType::kF32) {
    std::memcpy(out, bytes.data(), n * 4);
    return;
  }
  if (dtype == DType::kF8E4M3) {
    for (size_t i = 0; i < n; ++i) out[i] = E4m3ToFloat(bytes[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    out[i] = dtype == DType::kF16 ? HalfToFloat(v) : BFloat16ToFloat(v);
  }
}

}  // namespace inferd

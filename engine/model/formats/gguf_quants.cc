// Dequantization of the ggml block formats inferd reads. Layouts (little-endian, packed):
//   Q8_0 [f16 d][i8 q x32]                    x = d*q
//   Q4_0 [f16 d][u8 q x16]                    x[j] = d*(lo(q[j]) - 8), x[j+16] = d*(hi(q[j]) - 8)
//   Q4_1 [f16 d][f16 m][u8 q x16]             x[j] = d*lo(q[j]) + m,   x[j+16] = d*hi(q[j]) + m
//   Q5_0 [f16 d][u32 qh][u8 q x16]            x[j] = d*(lo(q[j]) | bit j of qh << 4) - 16),
//                                             x[j+16] = d*((hi(q[j]) | bit j+16 of qh << 4) - 16)
//   Q4_K [f16 d][f16 dmin][u8 scales x12][u8 q x128]   8 sub-blocks of 32 with 6-bit scales and mins
//   Q6_K [u8 ql x128][u8 qh x64][i8 scales x16][f16 d]  16 sub-blocks of 16, 6-bit values offset by 32
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/model/formats/gguf.h"
#include "engine/model/formats/safetensors.h"

namespace inferd {
namespace {

float F16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

void Q8_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<int8_t>(b[2 + j]);
}

void Q4_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  const uint8_t* q = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * ((q[j] & 0xF) - 8);
    y[j + 16] = d * ((q[j] >> 4) - 8);
  }
}

void Q4_1(const uint8_t* b, float* y) {
  const float d = F16At(b), m = F16At(b + 2);
  const uint8_t* q = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * (q[j] & 0xF) + m;
    y[j + 16] = d * (q[j] >> 4) + m;
  }
}

void Q5_0(const uint8_t* b, float* y) {
  const float d = F16At(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* q = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (q[j] & 0xF) | (((qh >> j) & 1) << 4);
    const int hi = (q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * (lo - 16);
    y[j + 16] = d * (hi - 16);
  }
}

// The 6-bit scale and min of sub-block j (0..7) packed in Q4_K's 12 scale bytes.
void ScaleMinK4(int j, const uint8_t* s, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void Q4_K(const uint8_t* b, float* y) {
  const float d = F16At(b), dmin = F16At(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int sub = 0; sub < 8; sub += 2, q += 32) {
    uint8_t sc, m;
    ScaleMinK4(sub, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    ScaleMinK4(sub + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
  }
}

void Q6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16At(b + 208);
  for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
  }
}

}  // namespace

absl::Status DequantizeGgml(uint32_t type, std::span<const uint8_t> bytes, int64_t numel, float* out) {
  int64_t block_elems = 0, block_bytes = 0;
  if (!GgmlBlockLayout(type, &block_elems, &block_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("gguf: cannot dequantize ", GgmlTypeName(type)));
  }
  if (numel % block_elems != 0 || static_cast<uint64_t>(numel / block_elems * block_bytes) != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: ", bytes.size(), " bytes do not hold ", numel, " ", GgmlTypeName(type), " elements"));
  }
  const uint8_t* p = bytes.data();
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      std::memcpy(out, p, numel * 4);
      break;
    case GgmlType::kF16:
      ConvertToF32(DType::kF16, bytes, out);
      break;
    case GgmlType::kBF16:
      ConvertToF32(DType::kBF16, bytes, out);
      break;
    default: {
      void (*block)(const uint8_t*, float*) = static_cast<GgmlType>(type) == GgmlType::kQ8_0   ? Q8_0
                                              : static_cast<GgmlType>(type) == GgmlType::kQ4_0 ? Q4_0
                                              : static_cast<GgmlType>(type) == GgmlType::kQ4_1 ? Q4_1
                                              : static_cast<GgmlType>(type) == GgmlType::kQ5_0 ? Q5_0
                                              : static_cast<GgmlType>(type) == GgmlType::kQ4_K ? Q4_K
                                                                                               : Q6_K;
      const int64_t blocks = numel / block_elems;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < blocks; ++i) block(p + i * block_bytes, out + i * block_elems);
    }
  }
  return absl::OkStatus();
}

}  // namespace inferd

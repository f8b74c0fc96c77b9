// Random weights for `model.load_format: dummy`: element (row, col) of a tensor is a pure function of the tensor's
// seed and its coordinates, the same on the host (the cpu backend, DecodeRows) and on the device (the cuda upload
// fills its shard in place), so any shard of any model is made where it is used, with nothing read or written on
// disk. Plain C++ that nvcc also compiles for the device.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define INFERD_HOST_DEVICE __host__ __device__
#else
#define INFERD_HOST_DEVICE
#endif

namespace inferd::kernels {

// One Philox4x32-10 block (Salmon et al., SC'11): four 32-bit words from a 128-bit counter and a 64-bit key.
INFERD_HOST_DEVICE inline void Philox4x32(const uint32_t counter_in[4], uint64_t key64, uint32_t out[4]) {
  uint32_t c[4] = {counter_in[0], counter_in[1], counter_in[2], counter_in[3]};
  uint32_t k0 = static_cast<uint32_t>(key64), k1 = static_cast<uint32_t>(key64 >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = static_cast<uint32_t>(p1);
    c[2] = n2;
    c[3] = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int i = 0; i < 4; ++i) out[i] = c[i];
}

// Uniform in [mean - std·√3, mean + std·√3): standard deviation `std`. Four consecutive columns share one block.
INFERD_HOST_DEVICE inline float RandomWeight(uint64_t seed, int64_t row, int64_t col, float mean, float std) {
  const uint32_t counter[4] = {static_cast<uint32_t>(col >> 2), static_cast<uint32_t>(row),
                               static_cast<uint32_t>(row >> 32), 0x77676874u /* "wght" */};
  uint32_t r[4];
  Philox4x32(counter, seed, r);
  const float u = static_cast<float>(r[col & 3] >> 8) * (1.0f / 16777216.0f);  // 24 bits: exact in fp32
  return mean + std * 1.7320508f * (2.0f * u - 1.0f);
}

}  // namespace inferd::kernels

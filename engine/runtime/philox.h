// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the number drawn for a token depends
// only on the request's seed and the token's position, never on what else runs in the batch or on which
// backend runs it.
#pragma once

#include <cstdint>

namespace inferd {

// One Philox4x32-10 block: four 32-bit words from a 128-bit counter and a 64-bit key.
inline void Philox4x32(const uint32_t counter_in[4], uint64_t key64, uint32_t out[4]) {
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

// A uniform double in [0, 1) for sampling the token at `position` of a request seeded with `seed`.
inline double SamplingUniform(uint64_t seed, int32_t position) {
  const uint32_t counter[4] = {static_cast<uint32_t>(position), 0x696e6665u /* "infe" */, 0, 0};
  uint32_t r[4];
  Philox4x32(counter, seed, r);
  const uint64_t bits = (uint64_t{r[0]} << 21) ^ (uint64_t{r[1]} >> 11);  // 53 random bits
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace inferd

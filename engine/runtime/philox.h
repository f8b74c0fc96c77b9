// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the number drawn for a token depends
// only on the request's seed and the token's position, never on what else runs in the batch or on which
// backend runs it.
#pragma once

#include <cstdint>

#include "kernels/random_weights.h"

namespace inferd {

using kernels::Philox4x32;  // one implementation, host and device (kernels/random_weights.h)

// A uniform double in [0, 1) for sampling the token at `position` of a request seeded with `seed`.
inline double SamplingUniform(uint64_t seed, int32_t position) {
  const uint32_t counter[4] = {static_cast<uint32_t>(position), 0x696e6665u /* "infe" */, 0, 0};
  uint32_t r[4];
  Philox4x32(counter, seed, r);
  const uint64_t bits = (uint64_t{r[0]} << 21) ^ (uint64_t{r[1]} >> 11);  // 53 random bits
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace inferd

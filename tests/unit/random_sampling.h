// Sampling parameters drawn over their whole documented ranges, extremes included, for the property tests of
// the host and the device sampler.
#pragma once

#include <random>
#include <vector>

#include "engine/request.h"

namespace inferd::testing {

// A value in [lo, hi], or one of `extremes` a third of the time.
inline float Pick(std::mt19937& rng, const std::vector<float>& extremes, float lo, float hi) {
  if (rng() % 3 == 0) return extremes[rng() % extremes.size()];
  return std::uniform_real_distribution<float>(lo, hi)(rng);
}

inline SamplingParams RandomSamplingParams(std::mt19937& rng, int32_t vocab) {
  SamplingParams p;
  p.temperature = Pick(rng, {0.f, 1e-30f, 1e-6f, 100.f}, 0.f, 100.f);
  p.top_k = static_cast<int32_t>(rng() % (vocab + 1));
  p.top_p = Pick(rng, {1e-38f, 1e-6f, 1.f}, 1e-6f, 1.f);
  p.min_p = Pick(rng, {0.f, 1.f}, 0.f, 1.f);
  p.repetition_penalty = Pick(rng, {1e-45f, 1e-38f, 1e-6f, 10.f}, 1e-6f, 10.f);
  p.presence_penalty = Pick(rng, {-2.f, 2.f}, -2.f, 2.f);
  p.frequency_penalty = Pick(rng, {-2.f, 2.f}, -2.f, 2.f);
  return p;
}

// Logits of a random scale, tiny to huge.
inline std::vector<float> RandomLogits(std::mt19937& rng, int32_t vocab) {
  const float scale = Pick(rng, {1e-30f, 1e30f}, 0.f, 50.f);
  std::vector<float> l(vocab);
  for (float& x : l) x = std::normal_distribution<float>(0.f, 1.f)(rng) * scale;
  return l;
}

}  // namespace inferd::testing

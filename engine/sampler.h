// Turns one sequence's next-token logits into a token: penalties, temperature, top-k, top-p, min-p,
// seeded sampling, and the raw log-probabilities the client asked for.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/request.h"

namespace inferd {

struct SampleContext {
  const SamplingParams* params = nullptr;
  std::span<const int32_t> tokens;  // prompt followed by output so far
  int32_t num_prompt_tokens = 0;
  std::span<const int32_t> banned;  // ids that may not be sampled now (eos/stop ids before min_tokens)
  int32_t top_logprobs = 0;         // how many alternatives to report; 0 = no logprobs
};

struct SampleResult {
  int32_t token = 0;
  bool has_logprob = false;
  TokenLogprob logprob;  // log-softmax of the raw logits
};

// logits is modified in place. rng is the request's own generator, so a seed reproduces a request
// whatever else runs in the batch.
SampleResult Sample(std::span<float> logits, const SampleContext& ctx, std::mt19937_64& rng);

}  // namespace inferd

// Turns one sequence's next-token logits into a token: penalties, temperature, top-k, top-p, min-p,
// seeded sampling, and the raw log-probabilities the client asked for.
#pragma once

#include <cstdint>
#include <span>

#include "engine/request.h"
#include "engine/runtime/backend.h"

namespace inferd {

struct SampleResult {
  int32_t token = 0;
  bool has_logprob = false;
  TokenLogprob logprob;  // log-softmax of the raw logits
};

// logits is modified in place. The row's uniform number picks the token among the candidates, so a seed
// reproduces a request whatever else runs in the batch.
SampleResult Sample(std::span<float> logits, const SamplingRow& row);

}  // namespace inferd

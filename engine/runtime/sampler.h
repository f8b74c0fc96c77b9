// Turns one sequence's next-token logits into a token: penalties, temperature, top-k, top-p, min-p,
// seeded sampling, and the raw log-probabilities the client asked for.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/runtime/backend.h"

namespace inferd {

struct SampleResult {
  int32_t token = 0;
  bool has_logprob = false;
  TokenLogprob logprob;  // log-softmax of the raw logits
};

// The sampler is a chain of steps, each callable alone (a row's distribution apart from its draw: the tests of
// speculative decoding's rule draw through them):
//   1. ShapeLogits: repetition, presence and frequency penalties, logit bias, banned ids (min_tokens), the output
//      constraint's mask — in place;
//   2. CandidatesOf: temperature, top-k, top-p and min-p — the tokens that may be drawn and their weights;
//   3. Draw: the row's uniform number picks one.
// The cuda backend's sampling kernel (kernels/sampling.h) runs the same steps in the same order, fused.
void ShapeLogits(std::span<float> logits, const SamplingRow& row);

struct Candidates {
  std::vector<int32_t> ids;   // most likely first (ties: the lower id); greedy: the argmax alone
  std::vector<double> probs;  // softmax over the top-k at the temperature, of the ids kept by top-p and min-p
  double total = 1;           // their sum: a draw picks among them in proportion
};
Candidates CandidatesOf(std::span<const float> logits, const SamplingParams& params);
int32_t Draw(const Candidates& candidates, double uniform);

// The whole chain; logits is modified in place. The row's uniform number picks the token among the candidates,
// so a seed reproduces a request whatever else runs in the batch.
SampleResult Sample(std::span<float> logits, const SamplingRow& row);

}  // namespace inferd

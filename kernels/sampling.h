// Sampling on the device: one token per logits row from fp32 logits, with repetition/presence/frequency
// penalties, logit bias, banned ids, a structured-output mask, temperature, top-k, top-p and min-p, and the raw
// log-probabilities a request asked for. The random number of each row comes from the host (counter-based, from the
// request's seed and the token's position), so seeded sampling never depends on the rest of the batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sizes.h"

namespace inferd::kernels {

// kMaxTopLogprobs, SamplingRowParams and the penalty flags: kernels/sizes.h.

// logits: [num_rows, vocab] fp32, modified in place. params: [num_rows]. penalty_tokens, penalty_counts (times
// the token occurs in the output), penalty_flags, penalty_bias (logit bias, read where kPenaltyBias is set):
// [penalty_indptr[num_rows]]. penalty_raw: scratch of the same length. Outputs: tokens [num_rows]; logprobs [num_rows]
// (the chosen token's log-softmax of the raw logits); top_ids, top_logprobs [num_rows, kMaxTopLogprobs]. Logprob
// outputs are written only for rows that ask. A row with a target (a prompt row) samples nothing: its token is the
// target and its logprob the target's. allowed: [num_rows, ⌈vocab / 32⌉] bitmasks, read for rows whose params
// say `masked` (bit t % 32 of word t / 32 allows token t; applied after the penalties and bias); may be null when
// no row is masked. masks_ready, where not null: a masked row reads its mask only once this word is nonzero (the
// host may still be copying the masks in, on another stream, while the kernel starts); it waits for it.
cudaError_t SampleRows(float* logits, int32_t num_rows, int32_t vocab, const SamplingRowParams* params,
                       const int32_t* penalty_indptr, const int32_t* penalty_tokens, const int32_t* penalty_counts,
                       const uint8_t* penalty_flags, const float* penalty_bias, float* penalty_raw,
                       const uint32_t* allowed, int32_t* tokens, float* logprobs, int32_t* top_ids, float* top_logprobs,
                       cudaStream_t stream, const uint32_t* masks_ready = nullptr);

}  // namespace inferd::kernels

// What a client asks of the engine and what the engine sends back, free of any transport type.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace inferd {

class CompiledConstraint;  // engine/grammar/output_constraint.h

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;  // unset = random
  // Added to these ids' logits after the penalties, before sampling (their reported logprobs stay the raw ones);
  // sorted by id, at most kMaxLogitBias.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Whether sampling reads the tokens so far (repetition, presence or frequency penalty).
  bool penalized() const { return repetition_penalty != 1.f || presence_penalty != 0.f || frequency_penalty != 0.f; }
};

// The most logit_bias entries a request may give (OpenAI's limit; backends size per-row buffers by it).
constexpr int32_t kMaxLogitBias = 300;
// The most stop_token_ids a request may give (backends size their per-step sampling buffers by it).
constexpr int32_t kMaxStopTokenIds = 256;
// What ends a request on the engine: tokens and lengths. Stop strings are text, matched on the server
// (server/text_output.h), which ends the request with Engine::StopAt.
struct StoppingParams {
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

// A token id a step may carry before the host knows it: the token that logits row `row` of the step
// launched just before this one samples. The engine plans step N + 1 while step N runs; the backend
// reads the real id on the device (engine/runtime/backend.h).
constexpr int32_t PendingToken(int32_t row) {
  return -1 - row;
}
constexpr bool IsPendingToken(int32_t token) {
  return token < 0;
}
constexpr int32_t PendingRow(int32_t token) {
  return -1 - token;
}

enum class FinishReason { kNone, kLength, kEos, kStopString, kStopToken, kAborted };
inline const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "none";
}

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  std::vector<TopLogprob> top;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;
};

struct Timing {
  double queue_s = 0;
  double time_to_first_token_s = 0;
  double total_s = 0;
};

// One increment of a request's output: token ids (the server makes the text). The last one has finish != kNone
// (or a non-OK error).
struct RequestOutput {
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  // On a request's first output when it asked for prompt_logprobs: prompt tokens 1 .. n-1, in order.
  std::vector<TokenLogprob> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;  // set when the engine could not serve the request (it is finished then)
  Usage usage;         // so far: completion_tokens counts this output's tokens
  Timing timing;       // so far: total_s is up to this output
};

// Receives a request's outputs on the engine thread. Push must not block.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  virtual void Push(RequestOutput output) = 0;
};

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StoppingParams stopping;
  int32_t top_logprobs = 0;
  // Set: each prompt token after the first gets its logprob given the tokens before it, with this many
  // alternatives (as vLLM's prompt_logprobs). Such a request computes its whole prompt (no prefix-cache reuse).
  std::optional<int32_t> prompt_logprobs;
  // Structured output: every token is one the constraint allows (ConstraintCompiler::Compile made it, off the
  // engine thread); null: unconstrained.
  std::shared_ptr<const CompiledConstraint> constraint;
  int32_t priority = 0;     // higher runs first; equal priorities in arrival order
  bool speculative = true;  // may draft and check its next tokens (speculative.method); false opts out
  absl::Time deadline = absl::InfiniteFuture();
  absl::Time arrival;   // set by Engine::Submit
  uint64_t handle = 0;  // set by Engine::Submit: the engine's identity of this request
  std::shared_ptr<OutputSink> sink;
};

}  // namespace inferd

// OpenAI's /v1/chat/completions and /v1/completions request bodies, turned into inferd's own GenerateRequests:
// one per prompt, each run n times. Everything is checked here or by the shared request builder; a field
// inferd does not serve (audio, the legacy functions, ...) is refused with its name, never ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "inferd/v1/inferd.pb.h"

namespace inferd {

enum class OpenAiRoute { kChat, kCompletion };

struct OpenAiRequest {
  OpenAiRoute route = OpenAiRoute::kChat;
  std::string model;                         // as the client named it; empty when not given
  std::vector<v1::GenerateRequest> prompts;  // completions may send several; chat one
  int n = 1;                                 // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool logprobs = false;       // chat: logprobs; completions: logprobs given (its value is top_logprobs)
  int top_logprobs = 0;        // alternatives shown per token
  // completions: each choice starts with its prompt's text and, with logprobs, the prompt tokens' logprobs (the
  // first token's null), as lm-evaluation-harness reads them to score a continuation.
  bool echo = false;
  // Where the request stated its output constraint ("response_format.json_schema.schema", "structured_outputs.regex"),
  // for errors the constraint's compilation reports under the gRPC field it travels in ("constraint.json_schema").
  std::string constraint_field;
  // With tools: whether an answer may hold several calls (false: the first only).
  bool parallel_tool_calls = true;
  // Fields inferd does not know (at most kMaxListedFields of them, each name cut to 64 bytes), and the known
  // extension fields it ignores at their values (SGLang's reasoning switches).
  std::vector<std::string> ignored_fields;
  // A thinking model's reasoning (SGLang's and vLLM's switches): split from the answer into reasoning_content;
  // included at all; streamed as it comes (else in the last chunk).
  bool separate_reasoning = true;
  bool include_reasoning = true;
  bool stream_reasoning = true;
};

constexpr int kMaxListedFields = 16;

// Choices a request may ask for (prompts × n).
constexpr int kMaxOpenAiChoices = 128;

// INVALID_ARGUMENT naming the field, its value and what is allowed.
// refuse_unknown: a field inferd does not know is refused (server.http_unknown_fields: refuse) rather than ignored.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(std::string_view body, OpenAiRoute route, bool refuse_unknown = false);

}  // namespace inferd

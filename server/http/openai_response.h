// The JSON inferd answers in on its OpenAI-compatible routes: whole responses, stream chunks, usage and errors
// in OpenAI's shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/chat/chat_template.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/openai_request.h"

namespace inferd {

// What every piece of one response shares.
struct OpenAiResponseContext {
  OpenAiRoute route = OpenAiRoute::kChat;
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool logprobs = false;
  int top_logprobs = 0;  // alternatives shown per token
  const Tokenizer* tokenizer = nullptr;
};

// One choice's output so far (a whole answer, or what one stream chunk carries).
// One piece of a streamed tool call: id and name on the call's first piece only.
struct ToolCallChunk {
  int32_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChoicePiece {
  int index = 0;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;
  bool first = false;  // a stream's first chunk of this choice (chat: it names the role)
  // The tools the model called (chat, whole): finish_reason "tool_calls".
  std::vector<ChatToolCall> tool_calls;
  // A stream's pieces of the calls as the model writes them: a call's first names it (index, id, name), the rest
  // add to its arguments.
  std::vector<ToolCallChunk> tool_call_deltas;
  bool called = false;    // a stream: the answer called a tool (finish_reason "tool_calls" on its last chunk)
  std::string reasoning;  // a thinking model's reasoning (chat): reasoning_content
};

struct UsageTotals {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

const char* OpenAiFinishReason(FinishReason reason);  // "stop", "length", "abort"; null while running
std::string OpenAiResponse(const OpenAiResponseContext& ctx, const std::vector<ChoicePiece>& choices,
                           const UsageTotals& usage);
// One Server-Sent Event ("data: {...}\n\n") for one choice's piece, or the usage at the end.
std::string OpenAiChunkEvent(const OpenAiResponseContext& ctx, const ChoicePiece& piece);
std::string OpenAiUsageEvent(const OpenAiResponseContext& ctx, const UsageTotals& usage);
inline constexpr const char* kOpenAiDoneEvent = "data: [DONE]\n\n";

// An error's HTTP status and its body ({"error": {"message", "type", "param", "code"}}).
int OpenAiHttpStatus(const absl::Status& status);
std::string OpenAiErrorBody(const absl::Status& status);
// With an HTTP status that no canonical code maps to (405, 415).
std::string OpenAiErrorBody(const absl::Status& status, int http_status);
std::string OpenAiErrorEvent(const absl::Status& status);  // mid-stream

}  // namespace inferd

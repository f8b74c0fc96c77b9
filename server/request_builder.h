// Validates a GenerateRequest against the model and turns it into an engine Request and the options of its
// text. Every refusal is INVALID_ARGUMENT naming the field, the value and the allowed range.
#pragma once

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/grammar/output_constraint.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "inferd/v1/inferd.pb.h"
#include "server/text_output.h"

namespace inferd {

struct ModelLimits {
  const Tokenizer* tokenizer = nullptr;
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;
  const ChatTemplate* chat_template = nullptr;      // null: the model has none and `messages` is refused
  const ConstraintCompiler* constraints = nullptr;  // structured output (the engine's)
};

// Tools a request may offer.
constexpr int kMaxTools = 128;

struct BuiltRequest {
  Request request;   // what the engine runs
  TextOptions text;  // how the server makes its text (server/text_output.h)
};

absl::StatusOr<BuiltRequest> BuildRequest(const v1::GenerateRequest& proto, const ModelLimits& limits);

}  // namespace inferd

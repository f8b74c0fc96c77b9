// Between the wire and the engine's types: requests parsed from raw bytes (so bytes protobuf refuses are
// INVALID_ARGUMENT naming the message), answers serialized, and the engine's outputs, model and state as protobuf.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <string>

#include "absl/status/status.h"
#include "engine/chat/tool_calls.h"
#include "engine/engine.h"
#include "inferd/v1/inferd.pb.h"

namespace inferd {

// Parses `buffer` as `message`; a message that does not parse is INVALID_ARGUMENT naming `name`.
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, const char* name, google::protobuf::Message* message);
void Serialize(const google::protobuf::Message& message, grpc::ByteBuffer* out);

// Appends one engine output (its tokens, text, logprobs; the finish, usage and timing when it ends the request).
void AppendOutput(const RequestOutput& out, const std::string& text, v1::GenerateChunk* chunk);
void AppendOutput(const RequestOutput& out, const std::string& text, v1::GenerateResult* result);

// A new tool call's id, as OpenAI forms them ("call_" and 24 letters and digits).
std::string NewToolCallId();

// A request's text gathered for its tool calls (TextOptions::tool_calls), which the last output gets.
class ToolCallText {
 public:
  explicit ToolCallText(ToolCallFormat format) : format_(format) {}
  void Add(const std::string& text, bool last, google::protobuf::RepeatedPtrField<v1::ToolCall>* calls);

 private:
  ToolCallFormat format_;
  std::string text_;
};

v1::ModelInfo ToModelInfo(const Engine& engine);
// The server's state; `engine` null while the model loads (the version alone then).
v1::ServerInfo ToServerInfo(const Engine* engine, const std::string& version);

}  // namespace inferd

// A model's chat template (Jinja, as in tokenizer_config.json or GGUF tokenizer.chat_template), compiled
// once at load and rendered per request the way Hugging Face's apply_chat_template renders it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/ast.h"
#include "engine/chat/tool_calls.h"

namespace inferd {

// A call an assistant made to one of the request's tools.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text (an object), as the API carries it
};

struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // an assistant's calls
  std::string tool_call_id;              // a tool's answer: the call it answers
  std::string name;                      // a tool's answer: the function's name
};

class ChatTemplate {
 public:
  // A syntax error or an unsupported construct is an error naming the line.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(const std::string& source, std::string bos_token,
                                                               std::string eos_token);
  // The prompt text for these messages with the assistant's turn opened (add_generation_prompt). A
  // template that refuses the messages (raise_exception) or fails is INVALID_ARGUMENT. tools_json: the request's
  // tools as a JSON list in OpenAI's shape ({"type": "function", "function": {"name", "description",
  // "parameters"}}), the template's `tools`; empty: none. A call's arguments reach the template as the object they
  // encode (as Hugging Face's templates expect them), or as text where they are not a JSON object.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                                     const std::string& tools_json = "") const;

  const std::string& source() const { return source_; }
  // Read from the source once, at Compile: whether it reads the request's tools (TakesTools); the format its
  // model writes calls in (engine/chat/tool_calls.h; Hermes where it reads no tools: ToolsSystemPrompt's words);
  // whether its model thinks in <think>…</think> (engine/chat/reasoning.h).
  bool takes_tools() const { return takes_tools_; }
  ToolCallFormat tool_call_format() const { return tool_call_format_; }
  bool thinks() const { return thinks_; }

 private:
  ChatTemplate() = default;
  std::string source_, bos_token_, eos_token_;
  bool takes_tools_ = false, thinks_ = false;
  ToolCallFormat tool_call_format_ = ToolCallFormat::kHermes;
  jinja::Body body_;
};

// Whether the template reads the request's tools (names `tools`); one that does not is told of them another way.
bool TakesTools(const std::string& template_source);

// Special tokens that end an assistant's turn in the template (<|im_end|>, <|eot_id|>, ...): the ones from
// a known list that the template source mentions.
std::vector<std::string> EndOfTurnTokens(const std::string& template_source);

}  // namespace inferd

// A model's chat template (Jinja, as in tokenizer_config.json or GGUF tokenizer.chat_template), compiled
// once at load and rendered per request the way Hugging Face's apply_chat_template renders it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/ast.h"

namespace inferd {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // A syntax error or an unsupported construct is an error naming the line.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(const std::string& source, std::string bos_token,
                                                               std::string eos_token);
  // The prompt text for these messages with the assistant's turn opened (add_generation_prompt). A
  // template that refuses the messages (raise_exception) or fails is INVALID_ARGUMENT.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  std::string source_, bos_token_, eos_token_;
  jinja::Body body_;
};

// Special tokens that end an assistant's turn in the template (<|im_end|>, <|eot_id|>, ...): the ones from
// a known list that the template source mentions.
std::vector<std::string> EndOfTurnTokens(const std::string& template_source);

}  // namespace inferd

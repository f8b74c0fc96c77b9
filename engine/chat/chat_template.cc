#include "engine/chat/chat_template.h"

#include "engine/chat/jinja/parser.h"
#include "engine/chat/jinja/render.h"
#include "engine/status_macros.h"

namespace inferd {

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Compile(const std::string& source, std::string bos_token,
                                                                    std::string eos_token) {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  INFERD_ASSIGN_OR_RETURN(t->body_, jinja::ParseTemplate(source));
  t->source_ = source;
  t->bos_token_ = std::move(bos_token);
  t->eos_token_ = std::move(eos_token);
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  using jinja::Value;
  jinja::List list;
  for (const ChatMessage& m : messages) {
    list.push_back(Value::MakeDict({{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}}));
  }
  const jinja::Dict globals = {
      {"messages", Value::MakeList(std::move(list))},
      {"add_generation_prompt", Value::Bool(add_generation_prompt)},
      {"bos_token", Value::Str(bos_token_)},
      {"eos_token", Value::Str(eos_token_)},
  };
  return jinja::Render(body_, globals);
}

std::vector<std::string> EndOfTurnTokens(const std::string& source) {
  static const char* kKnown[] = {"<|im_end|>",    "<|eot_id|>",      "<|end|>",
                                 "<end_of_turn>", "<|end_of_turn|>", "<|END_OF_TURN_TOKEN|>"};
  std::vector<std::string> out;
  for (const char* t : kKnown) {
    if (source.find(t) != std::string::npos) out.push_back(t);
  }
  return out;
}

}  // namespace inferd

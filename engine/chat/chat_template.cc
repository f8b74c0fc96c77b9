#include "engine/chat/chat_template.h"

#include "engine/chat/jinja/parser.h"
#include "engine/chat/jinja/render.h"
#include "engine/chat/reasoning.h"
#include "engine/status_macros.h"

namespace inferd {

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Compile(const std::string& source, std::string bos_token,
                                                                    std::string eos_token) {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  INFERD_ASSIGN_OR_RETURN(t->body_, jinja::ParseTemplate(source));
  t->source_ = source;
  t->takes_tools_ = TakesTools(source);
  t->tool_call_format_ = t->takes_tools_ ? ToolCallFormatOf(source) : ToolCallFormat::kHermes;
  t->thinks_ = TemplateThinks(source);
  t->bos_token_ = std::move(bos_token);
  t->eos_token_ = std::move(eos_token);
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                 const std::string& tools_json) const {
  using jinja::Value;
  jinja::List list;
  for (const ChatMessage& m : messages) {
    jinja::Dict message = {{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}};
    if (!m.tool_calls.empty()) {
      jinja::List calls;
      for (const ChatToolCall& c : m.tool_calls) {
        absl::StatusOr<Value> arguments = jinja::FromJson(c.arguments);
        if (!arguments.ok() || arguments->kind != Value::Kind::kDict) arguments = Value::Str(c.arguments);
        calls.push_back(Value::MakeDict(
            {{"id", Value::Str(c.id)},
             {"type", Value::Str("function")},
             {"function", Value::MakeDict({{"name", Value::Str(c.name)}, {"arguments", *std::move(arguments)}})}}));
      }
      message.emplace_back("tool_calls", Value::MakeList(std::move(calls)));
    }
    if (!m.tool_call_id.empty()) message.emplace_back("tool_call_id", Value::Str(m.tool_call_id));
    if (!m.name.empty()) message.emplace_back("name", Value::Str(m.name));
    list.push_back(Value::MakeDict(std::move(message)));
  }
  jinja::Dict globals = {
      {"messages", Value::MakeList(std::move(list))},
      {"add_generation_prompt", Value::Bool(add_generation_prompt)},
      {"bos_token", Value::Str(bos_token_)},
      {"eos_token", Value::Str(eos_token_)},
  };
  if (!tools_json.empty()) {
    absl::StatusOr<Value> tools = jinja::FromJson(tools_json);
    if (!tools.ok() || tools->kind != Value::Kind::kList) return absl::InvalidArgumentError("tools: not a JSON list");
    globals.emplace_back("tools", *std::move(tools));
  }
  return jinja::Render(body_, globals);
}

bool TakesTools(const std::string& source) {
  return source.find("tools") != std::string::npos;
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

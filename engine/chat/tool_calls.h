// Tool calls in a model's own words. A model writes its calls in the format its chat template teaches it, which
// is read from the template: Hermes' <tool_call>{"name", "arguments"}</tool_call> (Qwen2.5, Qwen3, Hermes and most
// templates with tools), Llama 3.1-3.3's bare {"name", "parameters"} object, Mistral's [TOOL_CALLS][{...}]. A
// template that does not read `tools` at all is told of them by a system message in Hermes' words. Here: that
// message, the shape a forced call takes (tool_choice "required" or a named function: the output is constrained to
// it), and the calls found in what the model wrote, whole or as a stream.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace inferd {

enum class ToolCallFormat { kHermes, kLlama3Json, kMistral };

ToolCallFormat ToolCallFormatOf(const std::string& template_source);
const char* ToolCallFormatName(ToolCallFormat format);

// A tool a request offers (OpenAI's {"type": "function", "function": {...}}).
struct ToolSpec {
  std::string name;
  std::string description;
  std::string parameters;  // a JSON schema of the arguments (an object), as JSON text; empty: any object
};

// The tools as the JSON list a template reads (OpenAI's shape).
std::string ToolsJson(const std::vector<ToolSpec>& tools);
// For a template that does not read tools: the system message that lists them and says how to call one.
std::string ToolsSystemPrompt(const std::vector<ToolSpec>& tools);

// A forced call as text: prefix, then a JSON value that `schema` (JSON text) admits, then suffix. `only`: the one
// function allowed; empty: any of the tools.
struct ToolCallShape {
  std::string prefix;
  std::string schema;
  std::string suffix;
};
ToolCallShape ForcedToolCall(ToolCallFormat format, const std::vector<ToolSpec>& tools, const std::string& only);

struct FoundToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object
};
struct ToolCallSplit {
  std::string content;  // what the model wrote outside its calls
  std::vector<FoundToolCall> calls;
};
// A finished answer split into its text and its calls; a call that does not parse stays in the text.
ToolCallSplit SplitToolCalls(ToolCallFormat format, std::string_view text);

// The same over a stream of text: Feed returns what may go out now as content (never the start of a call, nor
// text that may yet turn out to begin one); Finish splits what was held back.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  std::string Feed(std::string_view text);
  ToolCallSplit Finish();

 private:
  ToolCallFormat format_;
  bool in_calls_ = false;  // a call began: everything after is held to the end
  bool any_text_ = false;  // non-blank content went out (a Llama 3 call is the answer's first thing)
  std::string held_;
};

}  // namespace inferd

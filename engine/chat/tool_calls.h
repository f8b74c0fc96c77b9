// Tool calls in a model's own words. A model writes its calls in the format its chat template teaches it, which
// is read from the template: Hermes' <tool_call>{"name", "arguments"}</tool_call> (Qwen2.5, Qwen3, Hermes and most
// templates with tools), Llama 3.1-3.3's bare {"name", "parameters"} object, Mistral's [TOOL_CALLS][{...}]. A
// template that does not read `tools` at all is told of them by a system message in Hermes' words. Here: that
// message, the shape a forced call takes (tool_choice "required" or a named function: the output is constrained to
// it), and the calls found in what the model wrote, whole or as a stream.
#pragma once

#include <cstdint>
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

// A piece of one call as the model writes it (a streamed answer's delta). A call's pieces, in order, name it once
// (the first piece) and add up to its arguments' JSON text.
struct ToolCallDelta {
  int32_t index = 0;      // the call's place among the answer's calls
  std::string name;       // on the call's first piece only
  std::string arguments;  // the next bytes of its arguments
};

// The same over a stream of text: Feed returns what may go out now as content (never the start of a call, nor
// text that may yet turn out to begin one); Finish splits what was held back.
// With `deltas`, the calls go out as they are written instead: after each Feed, TakeDeltas gives each call's name
// once its "name" is complete and its arguments' bytes as they come; Finish then returns the content alone and
// leaves the rest of the calls (whole, for those no piece of which went out) to TakeDeltas. Once a piece of a call
// has gone out, what follows it in the text is not content: a call cut short (max_tokens) stays cut short.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format, bool deltas = false) : format_(format), deltas_(deltas) {}
  std::string Feed(std::string_view text);
  ToolCallSplit Finish();
  std::vector<ToolCallDelta> TakeDeltas();

 private:
  struct Call {
    std::string name;     // once its "name" value is complete (named)
    std::string pending;  // its arguments' bytes not yet taken
    bool named = false;
    bool begun = false;          // its first piece went out
    bool any_arguments = false;  // bytes of its arguments went out
  };
  std::string Release();     // the content that may go out of held_
  void Scan();               // follows the calls in held_ from scanned_ on
  void ScanJson(size_t at);  // the byte held_[at] of JSON that may hold calls
  void Flush();              // the named calls' pieces into out_

  ToolCallFormat format_;
  bool deltas_;
  bool in_calls_ = false;  // a call began: everything after is held to the end
  bool any_text_ = false;  // non-blank content went out (a Llama 3 call is the answer's first thing)
  std::string held_;
  // The scan of the held calls (deltas_ only).
  std::vector<Call> calls_;
  std::vector<ToolCallDelta> out_;
  size_t scanned_ = 0;
  bool in_json_ = false;    // inside JSON that may hold calls (Hermes: a <tool_call>'s object)
  int depth_ = 0;           // brackets open
  bool top_array_ = false;  // the outermost bracket is '[' (a list of calls)
  int call_depth_ = -1;     // depth of the current call's own keys; -1 outside a call
  bool in_string_ = false, escape_ = false;
  size_t string_start_ = 0;  // where the string being read began
  enum class Part { kNone, kKey, kName, kArguments } reading_ = Part::kNone;
  bool expect_key_ = false;   // at call depth: a key comes next
  std::string key_;           // the call's key whose value comes next
  bool value_next_ = false;   // after the key's ':', before its value
  int arguments_depth_ = -1;  // inside the arguments' object, which closes back to this depth
};

}  // namespace inferd

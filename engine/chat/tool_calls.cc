#include "engine/chat/tool_calls.h"

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "engine/json_depth.h"

namespace inferd {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// What starts a call in this format's output (Llama 3's bare object is found by FindCallStart).
std::string_view Marker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return kHermesOpen;
    case ToolCallFormat::kMistral:
      return kMistralOpen;
    case ToolCallFormat::kLlama3Json:
      return kPythonTag;
  }
  return kHermesOpen;
}

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && absl::ascii_isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// One call object ({"name": ..., "arguments" or "parameters": an object, or its text}); false when it is not one.
bool CallOf(const ojson& j, FoundToolCall* out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  ojson args = j.contains(key) ? j[key] : ojson::object();
  if (args.is_string()) {
    if (JsonDepth(args.get<std::string>()) > kMaxJsonTextDepth) return false;
    args = ojson::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded()) return false;
  }
  if (!args.is_object()) return false;
  out->name = j["name"].get<std::string>();
  out->arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

// The JSON value at s[i] (an object or array); discarded when there is none or it does not parse.
ojson ValueAt(std::string_view s, size_t i, size_t* end) {
  *end = i < s.size() && (s[i] == '{' || s[i] == '[') ? JsonValueEnd(s, i) : std::string_view::npos;
  if (*end == std::string_view::npos || JsonDepth(s.substr(i, *end - i)) > kMaxJsonTextDepth) {
    return ojson(ojson::value_t::discarded);
  }
  return ojson::parse(s.substr(i, *end - i), nullptr, /*allow_exceptions=*/false);
}

ToolCallSplit SplitHermes(std::string_view text) {
  ToolCallSplit out;
  size_t i = 0;
  while (true) {
    const size_t open = text.find(kHermesOpen, i);
    if (open == std::string_view::npos) break;
    size_t end = 0;
    FoundToolCall call;
    const size_t at = SkipSpace(text, open + kHermesOpen.size());
    const ojson j = ValueAt(text, at, &end);
    if (j.is_discarded() || !CallOf(j, &call)) break;
    out.content.append(text.substr(i, open - i));
    out.calls.push_back(std::move(call));
    i = SkipSpace(text, end);
    if (text.substr(i, kHermesClose.size()) == kHermesClose) i += kHermesClose.size();
    i = SkipSpace(text, i);
  }
  out.content.append(text.substr(i));
  return out;
}

// Objects one after another (separated by ';' or blanks), or one array of them, from s[i] to the end; false
// unless all of it is calls.
bool CallsToEnd(std::string_view s, size_t i, std::vector<FoundToolCall>* calls) {
  i = SkipSpace(s, i);
  if (i < s.size() && s[i] == '[') {
    size_t end = 0;
    const ojson j = ValueAt(s, i, &end);
    if (j.is_discarded() || !j.is_array() || j.empty() || SkipSpace(s, end) != s.size()) return false;
    for (const ojson& e : j) {
      if (!CallOf(e, &calls->emplace_back())) return false;
    }
    return true;
  }
  while (i < s.size()) {
    size_t end = 0;
    const ojson j = ValueAt(s, i, &end);
    if (j.is_discarded() || !CallOf(j, &calls->emplace_back())) return false;
    i = SkipSpace(s, end);
    if (i < s.size() && s[i] == ';') i = SkipSpace(s, i + 1);
  }
  return !calls->empty();
}

ojson CallSchema(ToolCallFormat format, const ToolSpec& tool) {
  ojson params = tool.parameters.empty() ? ojson(ojson::value_t::discarded)
                                         : ojson::parse(tool.parameters, nullptr, /*allow_exceptions=*/false);
  if (params.is_discarded() || !params.is_object()) params = {{"type", "object"}};
  const char* args = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  ojson schema = {{"type", "object"}};
  schema["properties"] = ojson::object();
  schema["properties"]["name"] = {{"const", tool.name}};
  schema["properties"][args] = std::move(params);
  schema["required"] = {"name", args};
  schema["additionalProperties"] = false;
  return schema;
}

}  // namespace

ToolCallFormat ToolCallFormatOf(const std::string& source) {
  const auto has = [&](std::string_view s) { return source.find(s) != std::string::npos; };
  if (has(kHermesOpen)) return ToolCallFormat::kHermes;
  if (has(kMistralOpen)) return ToolCallFormat::kMistral;
  if (has(kPythonTag) || has("\"parameters\": dictionary")) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kHermes;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "hermes";
}

std::string ToolsJson(const std::vector<ToolSpec>& tools) {
  ojson list = ojson::array();
  for (const ToolSpec& t : tools) {
    ojson function = {{"name", t.name}};
    if (!t.description.empty()) function["description"] = t.description;
    ojson params = t.parameters.empty() ? ojson(ojson::value_t::discarded)
                                        : ojson::parse(t.parameters, nullptr, /*allow_exceptions=*/false);
    if (!params.is_discarded()) function["parameters"] = std::move(params);
    list.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return list.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string ToolsSystemPrompt(const std::vector<ToolSpec>& tools) {
  std::string out =
      "You can call functions to answer the user. Their signatures, one JSON object per line, inside <tools></tools>:"
      "\n<tools>";
  const ojson list = ojson::parse(ToolsJson(tools));
  for (const ojson& t : list) out += "\n" + t.dump(-1, ' ', false, ojson::error_handler_t::replace);
  out +=
      "\n</tools>\n\nTo call a function, answer with its name and arguments as one JSON object inside "
      "<tool_call></tool_call> tags, one pair of tags per call:\n<tool_call>\n{\"name\": \"function name\", "
      "\"arguments\": {\"argument\": \"value\"}}\n</tool_call>";
  return out;
}

ToolCallShape ForcedToolCall(ToolCallFormat format, const std::vector<ToolSpec>& tools, const std::string& only) {
  ojson choices = ojson::array();
  for (const ToolSpec& t : tools) {
    if (only.empty() || t.name == only) choices.push_back(CallSchema(format, t));
  }
  ojson call = choices.size() == 1 ? choices[0] : ojson{{"anyOf", std::move(choices)}};
  ToolCallShape shape;
  switch (format) {
    case ToolCallFormat::kHermes:
      shape.prefix = std::string(kHermesOpen) + "\n";
      shape.suffix = "\n" + std::string(kHermesClose);
      break;
    case ToolCallFormat::kMistral:
      shape.prefix = std::string(kMistralOpen);
      call = {{"type", "array"}, {"items", std::move(call)}, {"minItems", 1}, {"maxItems", 1}};
      break;
    case ToolCallFormat::kLlama3Json:
      break;
  }
  shape.schema = call.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return shape;
}

ToolCallSplit SplitToolCalls(ToolCallFormat format, std::string_view text) {
  if (format == ToolCallFormat::kHermes) return SplitHermes(text);
  ToolCallSplit out;
  size_t start = SkipSpace(text, 0);
  if (format == ToolCallFormat::kMistral || text.substr(start, kPythonTag.size()) == kPythonTag) {
    const std::string_view marker = format == ToolCallFormat::kMistral ? kMistralOpen : kPythonTag;
    const size_t at = text.find(marker);
    if (at == std::string_view::npos) {
      out.content = std::string(text);
      return out;
    }
    out.content = std::string(text.substr(0, at));
    start = at + marker.size();
  }
  if (!CallsToEnd(text, start, &out.calls)) {
    out.calls.clear();
    out.content = std::string(text);
  }
  return out;
}

std::string ToolCallStream::Feed(std::string_view text) {
  held_.append(text);
  if (in_calls_) return "";
  std::string_view marker = Marker(format_);
  size_t at = held_.find(marker);
  if (format_ == ToolCallFormat::kLlama3Json && !any_text_ && at == std::string::npos) {
    const size_t first = SkipSpace(held_, 0);
    if (first == held_.size()) return "";  // blanks only: they may come before the call's '{'
    if (held_[first] == '{') at = 0;
  }
  if (at != std::string::npos) {
    std::string out = held_.substr(0, at);
    held_.erase(0, at);
    in_calls_ = true;
    return out;
  }
  // Keep the longest end of the text that could begin the marker.
  size_t keep = std::min(held_.size(), marker.size() - 1);
  while (keep > 0 && !marker.starts_with(std::string_view(held_).substr(held_.size() - keep))) --keep;
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  if (SkipSpace(out, 0) < out.size()) any_text_ = true;
  return out;
}

ToolCallSplit ToolCallStream::Finish() {
  ToolCallSplit out;
  if (in_calls_) {
    out = SplitToolCalls(format_, held_);
  } else {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace inferd

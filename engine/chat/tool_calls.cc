#include "engine/chat/tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

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
  std::string out = Release();
  if (deltas_ && in_calls_) Scan();
  return out;
}

std::string ToolCallStream::Release() {
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
  if (!deltas_) return out;
  Flush();
  const auto begun = std::count_if(calls_.begin(), calls_.end(), [](const Call& c) { return c.begun; });
  for (size_t k = 0; k < out.calls.size(); ++k) {  // what of the calls has not gone out
    const int32_t index = static_cast<int32_t>(k);
    FoundToolCall& found = out.calls[k];
    if (k >= calls_.size() || !calls_[k].begun) {
      out_.push_back({index, std::move(found.name), std::move(found.arguments)});
    } else if (!calls_[k].any_arguments) {  // its arguments were not an object written out (a string, or none)
      out_.push_back({index, "", std::move(found.arguments)});
    }
  }
  // Pieces of more calls went out than the text holds whole (one was cut short): the rest of it is theirs.
  if (static_cast<size_t>(begun) > out.calls.size()) out.content.clear();
  out.calls.clear();
  return out;
}

std::vector<ToolCallDelta> ToolCallStream::TakeDeltas() {
  Flush();
  return std::exchange(out_, {});
}

void ToolCallStream::Flush() {
  for (size_t k = 0; k < calls_.size(); ++k) {
    Call& call = calls_[k];
    if (!call.named || (call.begun && call.pending.empty())) continue;
    call.any_arguments |= !call.pending.empty();
    out_.push_back({static_cast<int32_t>(k), call.begun ? "" : call.name, std::exchange(call.pending, {})});
    call.begun = true;
  }
}

void ToolCallStream::Scan() {
  while (scanned_ < held_.size()) {
    if (!in_json_ && format_ != ToolCallFormat::kHermes) {  // the region is JSON after its marker, if any
      const std::string_view marker = Marker(format_);
      if (std::string_view(held_).starts_with(marker)) scanned_ = marker.size();
      in_json_ = true;
      continue;
    }
    if (!in_json_) {  // Hermes: the next <tool_call>, then its object
      const size_t open = held_.find(kHermesOpen, scanned_);
      if (open == std::string::npos) {  // keep the bytes that may begin one
        scanned_ = std::max(scanned_, held_.size() - std::min(held_.size(), kHermesOpen.size() - 1));
        return;
      }
      const size_t at = SkipSpace(held_, open + kHermesOpen.size());
      if (at == held_.size()) {  // what follows the marker is still to come
        scanned_ = open;
        return;
      }
      scanned_ = at;
      if (held_[at] != '{') continue;  // not a call's object: the split keeps it as text
      in_json_ = true;
    }
    ScanJson(scanned_++);
  }
}

void ToolCallStream::ScanJson(size_t at) {
  const char c = held_[at];
  if (arguments_depth_ >= 0) calls_.back().pending += c;  // every byte of the arguments, strings and blanks too
  if (in_string_) {
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (reading_ == Part::kKey || reading_ == Part::kName) {
        const ojson j = ojson::parse(std::string_view(held_).substr(string_start_, at + 1 - string_start_), nullptr,
                                     /*allow_exceptions=*/false);
        std::string text = j.is_string() ? j.get<std::string>() : std::string();
        if (reading_ == Part::kKey) {
          key_ = std::move(text);
          expect_key_ = false;
        } else {
          calls_.back().name = std::move(text);
          calls_.back().named = true;
        }
      }
      reading_ = Part::kNone;
    }
    return;
  }
  if (absl::ascii_isspace(static_cast<unsigned char>(c))) return;
  const bool at_call = call_depth_ >= 0 && depth_ == call_depth_;
  if (at_call && value_next_) {  // the first byte of a key's value
    value_next_ = false;
    if (key_ == "name" && c == '"') reading_ = Part::kName;
    if ((key_ == "arguments" || key_ == "parameters") && c == '{') {
      arguments_depth_ = depth_;
      calls_.back().pending += c;
    }
  }
  switch (c) {
    case '"':
      in_string_ = true;
      string_start_ = at;
      if (at_call && expect_key_) reading_ = Part::kKey;
      break;
    case '{':
    case '[':
      if (depth_ == 0) top_array_ = c == '[';
      if (call_depth_ < 0 && c == '{' && (depth_ == 0 || (depth_ == 1 && top_array_))) {  // a call's object
        call_depth_ = depth_ + 1;
        calls_.emplace_back();
        expect_key_ = true;
        value_next_ = false;
      }
      ++depth_;
      break;
    case '}':
    case ']':
      depth_ = std::max(0, depth_ - 1);
      if (arguments_depth_ >= 0 && depth_ == arguments_depth_) arguments_depth_ = -1;  // its '}' went in above
      if (call_depth_ >= 0 && depth_ < call_depth_) call_depth_ = -1;
      if (depth_ == 0 && format_ == ToolCallFormat::kHermes) in_json_ = false;  // the next <tool_call> is sought
      break;
    case ',':
      if (at_call) expect_key_ = true;
      break;
    case ':':
      if (at_call) value_next_ = true;
      break;
    default:
      break;
  }
}

}  // namespace inferd

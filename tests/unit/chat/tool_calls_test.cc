// Tool calls in a model's words (engine/chat/tool_calls.h): the format read from real templates, calls found in
// finished and streamed answers of each format (text that is not a call stays text), and forced calls that
// xgrammar walks into text that parses back into the call.
#include "engine/chat/tool_calls.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/chat/chat_template.h"
#include "engine/model/model.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

const std::vector<ToolSpec> kTools = {
    {"get_weather", "The weather in a city",
     R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"},
    {"add", "", R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})"}};

TEST(ToolCalls, TheFormatIsReadFromTheTemplate) {
  auto qwen3 = LoadModel(testing::SourcePath("tests/fixtures/models/qwen3-tiny"));
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(ToolCallFormatOf((*qwen3)->chat_template->source()), ToolCallFormat::kHermes);
  EXPECT_TRUE(TakesTools((*qwen3)->chat_template->source()));
  EXPECT_TRUE((*qwen3)->chat_template->takes_tools() && (*qwen3)->chat_template->thinks());
  EXPECT_EQ((*qwen3)->chat_template->tool_call_format(), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{ '[TOOL_CALLS]' }}{{ tools }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOf("{{- '<|python_tag|>' }}"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ToolCallFormatOf("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolCallFormat::kHermes);
  EXPECT_FALSE(TakesTools("{% for m in messages %}{{ m.content }}{% endfor %}"));
}

TEST(ToolCalls, HermesCallsAreFoundAndTheRestIsContent) {
  const ToolCallSplit s = SplitToolCalls(
      ToolCallFormat::kHermes,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}</tool_call>");
  EXPECT_EQ(s.content, "Let me check.\n");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(s.calls[0].arguments), nlohmann::json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(s.calls[1].name, "add");
  EXPECT_EQ(nlohmann::json::parse(s.calls[1].arguments), nlohmann::json::parse(R"({"a": 1, "b": 2})"));

  // Not calls: no object, a broken one, one without a name, arguments that are not an object.
  for (const char* text : {"<tool_call>oops</tool_call>", "<tool_call>\n{\"name\": \"add\", \"arguments\": {",
                           "<tool_call>{\"arguments\": {}}</tool_call>",
                           "<tool_call>{\"name\": \"add\", "
                           "\"arguments\": [1]}</tool_call>"}) {
    const ToolCallSplit bad = SplitToolCalls(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(bad.calls.empty()) << text;
    EXPECT_EQ(bad.content, text);
  }
}

// JSON nested 100,000 deep where no request body's bound saw it (a model's output, a call's arguments sent as
// text) is never built into values: it stays text.
TEST(ToolCalls, DeepJsonStaysText) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string call = "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": " + deep + "}}</tool_call>";
  const ToolCallSplit split = SplitToolCalls(ToolCallFormat::kHermes, call);
  EXPECT_TRUE(split.calls.empty());
  EXPECT_EQ(split.content.size(), call.size());
  EXPECT_TRUE(SplitToolCalls(ToolCallFormat::kLlama3Json, deep).calls.empty());

  auto qwen3 = LoadModel(testing::SourcePath("tests/fixtures/models/qwen3-tiny"));
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  ChatMessage assistant{"assistant", ""};
  assistant.tool_calls.push_back({"call_1", "add", "{\"a\": " + deep + "}"});
  auto text = (*qwen3)->chat_template->Render({{"user", "x"}, assistant}, true, ToolsJson(kTools));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find(deep), std::string::npos) << "the arguments go to the template as their text";
}

TEST(ToolCalls, Llama3AndMistralCallsAreFound) {
  ToolCallSplit s = SplitToolCalls(ToolCallFormat::kLlama3Json,
                                   " {\"name\": \"add\", \"parameters\": {\"a\": 1}}; {\"name\": \"get_weather\", "
                                   "\"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[1].name, "get_weather");
  EXPECT_TRUE(s.content.empty() || s.content == " ");
  s = SplitToolCalls(ToolCallFormat::kLlama3Json, "<|python_tag|>{\"name\": \"add\", \"parameters\": {}}");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, "{}");
  s = SplitToolCalls(ToolCallFormat::kLlama3Json, "The answer is {not json}.");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "The answer is {not json}.");
  s = SplitToolCalls(ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 2}}]");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "add");
  EXPECT_EQ(s.content, "");
}

// Streamed a byte at a time and in whole pieces: the content that goes out never holds a call's first bytes, and
// what is found at the end equals the whole answer's split.
TEST(ToolCalls, AStreamReleasesContentButNeverTheStartOfACall) {
  const std::vector<std::pair<ToolCallFormat, std::string>> answers = {
      {ToolCallFormat::kHermes,
       "Sure <tool_ca and more.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n"
       "</tool_call>"},
      {ToolCallFormat::kHermes, "No call here, only < and <tool_"},
      {ToolCallFormat::kLlama3Json, "  {\"name\": \"add\", \"parameters\": {\"a\": 3}}"},
      {ToolCallFormat::kLlama3Json, "Plain text with a {brace} later."},
      {ToolCallFormat::kMistral, "ok [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {}}]"}};
  for (const auto& [format, answer] : answers) {
    for (size_t piece : {size_t{1}, size_t{5}, answer.size()}) {
      ToolCallStream stream(format);
      std::string released;
      for (size_t i = 0; i < answer.size(); i += piece) {
        const std::string out = stream.Feed(std::string_view(answer).substr(i, piece));
        released += out;
        EXPECT_EQ(out.find("<tool_call>"), std::string::npos) << answer;
        EXPECT_EQ(out.find("[TOOL_CALLS]"), std::string::npos) << answer;
      }
      const ToolCallSplit end = stream.Finish();
      const ToolCallSplit whole = SplitToolCalls(format, answer);
      SCOPED_TRACE(answer + " in pieces of " + std::to_string(piece));
      ASSERT_EQ(end.calls.size(), whole.calls.size());
      for (size_t k = 0; k < end.calls.size(); ++k) EXPECT_EQ(end.calls[k].arguments, whole.calls[k].arguments);
      if (whole.calls.empty()) {
        EXPECT_EQ(released + end.content, answer) << "without calls, all of it is content";
      } else {
        EXPECT_EQ(released + end.content, whole.content);
      }
    }
  }
}

// With deltas, the calls go out as they are written: each call's first piece names it, its pieces add up to its
// arguments (the same JSON as the whole answer's split), and none of it is content; in pieces of any size.
TEST(ToolCalls, StreamedCallsGoOutInPiecesThatAddUpToTheSplitsCalls) {
  const std::vector<std::pair<ToolCallFormat, std::string>> answers = {
      {ToolCallFormat::kHermes,
       "Let me see. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": [1, {\"c\": \"}\\\"{\"}]}}\n"
       "</tool_call>\n<tool_call>\n{\"arguments\": {\"x\": \"y\"}, \"name\": \"sub\"}\n</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"},
      {ToolCallFormat::kLlama3Json, "  {\"name\": \"add\", \"parameters\": {\"a\": 3}}"},
      {ToolCallFormat::kLlama3Json, "<|python_tag|>{\"name\": \"add\", \"parameters\": {}}; {\"name\": \"sub\"}"},
      {ToolCallFormat::kMistral,
       "ok [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": {}}}, {\"name\": \"sub\", \"arguments\": {}}]"}};
  for (const auto& [format, answer] : answers) {
    const ToolCallSplit whole = SplitToolCalls(format, answer);
    ASSERT_FALSE(whole.calls.empty()) << answer;
    for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, answer.size()}) {
      SCOPED_TRACE(answer + " in pieces of " + std::to_string(piece));
      ToolCallStream stream(format, /*deltas=*/true);
      std::string content;
      std::vector<ToolCallDelta> deltas;
      size_t pieces_before_the_end = 0;
      for (size_t i = 0; i < answer.size(); i += piece) {
        content += stream.Feed(std::string_view(answer).substr(i, piece));
        for (ToolCallDelta& d : stream.TakeDeltas()) deltas.push_back(std::move(d));
        pieces_before_the_end = deltas.size();
      }
      const ToolCallSplit end = stream.Finish();
      EXPECT_TRUE(end.calls.empty()) << "with deltas every call goes out in pieces";
      content += end.content;
      for (ToolCallDelta& d : stream.TakeDeltas()) deltas.push_back(std::move(d));
      EXPECT_EQ(content, whole.content);
      std::vector<std::string> names, arguments;
      for (const ToolCallDelta& d : deltas) {
        ASSERT_LE(d.index, static_cast<int32_t>(names.size())) << "calls go out in order";
        if (d.index == static_cast<int32_t>(names.size())) {
          EXPECT_FALSE(d.name.empty()) << "a call's first piece names it";
          names.push_back(d.name);
          arguments.emplace_back();
        } else {
          EXPECT_TRUE(d.name.empty()) << "only the first piece names the call";
        }
        arguments[d.index] += d.arguments;
      }
      ASSERT_EQ(names.size(), whole.calls.size());
      for (size_t k = 0; k < names.size(); ++k) {
        EXPECT_EQ(names[k], whole.calls[k].name);
        EXPECT_EQ(nlohmann::json::parse(arguments[k]), nlohmann::json::parse(whole.calls[k].arguments)) << arguments[k];
      }
      // Arguments written as an object go out as they come; as a JSON string, whole at the end.
      if (piece == 1 && answer.find("\"arguments\": \"") == std::string::npos) {
        EXPECT_GT(pieces_before_the_end, names.size()) << "arguments went out before the answer ended";
      }
    }
  }
}

// A call cut short (max_tokens) stays what went out: its pieces so far, and none of its text as content.
TEST(ToolCalls, AStreamedCallCutShortIsNotRepeatedAsContent) {
  ToolCallStream stream(ToolCallFormat::kHermes, /*deltas=*/true);
  EXPECT_EQ(stream.Feed("Hi. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\""), "Hi. ");
  const std::vector<ToolCallDelta> deltas = stream.TakeDeltas();
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].name, "add");
  EXPECT_EQ(deltas[0].arguments, "{\"a\": 1, \"b\"");
  EXPECT_EQ(stream.Finish().content, "");
  EXPECT_TRUE(stream.TakeDeltas().empty());
}

TEST(ToolCalls, AForcedCallAdmitsOnlyTheNamedToolsArguments) {
  const ToolCallShape any = ForcedToolCall(ToolCallFormat::kHermes, kTools, "");
  EXPECT_EQ(any.prefix, "<tool_call>\n");
  EXPECT_EQ(any.suffix, "\n</tool_call>");
  const nlohmann::json schema = nlohmann::json::parse(any.schema);
  ASSERT_TRUE(schema.contains("anyOf"));
  EXPECT_EQ(schema["anyOf"].size(), 2u);
  const nlohmann::json one = nlohmann::json::parse(ForcedToolCall(ToolCallFormat::kHermes, kTools, "add").schema);
  EXPECT_EQ(one["properties"]["name"]["const"], "add");
  EXPECT_EQ(one["required"], nlohmann::json::parse(R"(["name", "arguments"])"));
  const nlohmann::json llama = nlohmann::json::parse(ForcedToolCall(ToolCallFormat::kLlama3Json, kTools, "add").schema);
  EXPECT_TRUE(llama["properties"].contains("parameters"));
  const ToolCallShape mistral = ForcedToolCall(ToolCallFormat::kMistral, kTools, "get_weather");
  EXPECT_EQ(mistral.prefix, "[TOOL_CALLS]");
  EXPECT_EQ(nlohmann::json::parse(mistral.schema)["maxItems"], 1);
}

// A template without tools learns of them from a system message; one with tools renders them as transformers
// would (the Qwen3 fixture's template: the tools in a system turn, an assistant's call and the tool's answer).
TEST(ToolCalls, TemplatesReceiveToolsCallsAndAnswers) {
  const std::string prompt = ToolsSystemPrompt(kTools);
  EXPECT_NE(prompt.find("\"name\":\"get_weather\""), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tool_call>"), std::string::npos);

  auto qwen3 = LoadModel(testing::SourcePath("tests/fixtures/models/qwen3-tiny"));
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  std::vector<ChatMessage> messages = {{"user", "Weather in Paris?"}};
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris"})"});
  messages.push_back(call);
  ChatMessage answer{"tool", "18 C"};
  answer.tool_call_id = "call_1";
  messages.push_back(answer);
  auto text = (*qwen3)->chat_template->Render(messages, true, ToolsJson(kTools));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), std::string::npos)
      << *text;
  EXPECT_NE(text->find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("<tool_response>\n18 C\n</tool_response>"), std::string::npos) << *text;
  EXPECT_FALSE((*qwen3)->chat_template->Render(messages, true, "{\"not\": \"a list\"}").ok());
}

}  // namespace
}  // namespace inferd

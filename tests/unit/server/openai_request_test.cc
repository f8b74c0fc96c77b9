// OpenAI request bodies → inferd's GenerateRequests: every accepted field lands where it belongs, and every
// refusal names the field.
#include "server/http/openai_request.h"

#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace inferd {
namespace {

OpenAiRequest Parse(const std::string& body, OpenAiRoute route = OpenAiRoute::kChat) {
  auto r = ParseOpenAiRequest(body, route);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAiRequest{};
}

std::string Refusal(const std::string& body, OpenAiRoute route = OpenAiRoute::kChat, bool refuse_unknown = false) {
  auto r = ParseOpenAiRequest(body, route, refuse_unknown);
  EXPECT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(OpenAiRequest, ChatFieldsLandInTheGenerateRequest) {
  const OpenAiRequest r = Parse(R"({"model": "m", "messages": [{"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
      "temperature": 0.3, "top_p": 0.9, "top_k": 7, "min_p": 0.05, "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 42, "max_completion_tokens": 9,
      "stop": ["\n\n", "END"], "n": 2, "logprobs": true, "top_logprobs": 4, "ignore_eos": true, "min_tokens": 3,
      "stream": true, "stream_options": {"include_usage": true}, "user": "u1", "logit_bias": {"5": -100, "17": 2.5},
      "speculative": false})");
  ASSERT_EQ(r.prompts.size(), 1u);
  const v1::GenerateRequest& g = r.prompts[0];
  ASSERT_EQ(g.messages().messages_size(), 2);
  EXPECT_EQ(g.messages().messages(0).role(), "system");
  EXPECT_EQ(g.messages().messages(1).content(), "Hi there");
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.3f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 7);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.05f);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_EQ(g.sampling().seed(), 42u);
  EXPECT_EQ(g.stopping().max_tokens(), 9);
  EXPECT_EQ(g.stopping().min_tokens(), 3);
  EXPECT_TRUE(g.stopping().ignore_eos());
  EXPECT_TRUE(g.no_speculation());
  ASSERT_EQ(g.stopping().stop_size(), 2);
  EXPECT_EQ(g.stopping().stop(1), "END");
  EXPECT_EQ(g.output().top_logprobs(), 4);
  ASSERT_EQ(g.sampling().logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(g.sampling().logit_bias().at(5), -100.f);
  EXPECT_FLOAT_EQ(g.sampling().logit_bias().at(17), 2.5f);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.top_logprobs, 4);
}

TEST(OpenAiRequest, CompletionPromptsAreStringsTokenIdsOrListsOfThem) {
  const OpenAiRequest r =
      Parse(R"({"prompt": ["a b", [1, 2, 3]], "logprobs": 0, "temperature": 0})", OpenAiRoute::kCompletion);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].text(), "a b");
  EXPECT_EQ(r.prompts[1].token_ids().ids_size(), 3);
  EXPECT_EQ(r.prompts[1].stopping().max_tokens(), 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(r.prompts[1].sampling().temperature(), 0.f);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.prompts[0].output().top_logprobs(), 1);  // the token's own logprob comes with its top one
  EXPECT_EQ(Parse(R"({"prompt": [5, 6]})", OpenAiRoute::kCompletion).prompts[0].token_ids().ids(1), 6);
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(r.prompts[0].output().has_prompt_logprobs());
}

// echo: the prompt comes back before the answer; with logprobs its tokens are scored (prompt_logprobs, with as many
// alternatives as logprobs asks), without them only its text comes back.
TEST(OpenAiRequest, EchoWithLogprobsScoresThePrompt) {
  const OpenAiRequest r =
      Parse(R"({"prompt": [[1, 2, 3]], "echo": true, "logprobs": 3, "max_tokens": 1})", OpenAiRoute::kCompletion);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.prompts[0].output().prompt_logprobs(), 3);
  const OpenAiRequest text = Parse(R"({"prompt": "a b", "echo": true})", OpenAiRoute::kCompletion);
  EXPECT_TRUE(text.echo);
  EXPECT_FALSE(text.prompts[0].output().has_prompt_logprobs());
}

TEST(OpenAiRequest, ToolsChoicesCallsAndAnswersTravelInTheRequest) {
  const OpenAiRequest r = Parse(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})");
  const v1::GenerateRequest& p = r.prompts[0];
  ASSERT_EQ(p.tools_size(), 1);
  EXPECT_EQ(p.tools(0).name(), "get_weather");
  EXPECT_EQ(p.tools(0).parameters(), R"({"type":"object"})");
  EXPECT_EQ(p.tool_choice().mode(), v1::ToolChoice::FUNCTION);
  EXPECT_EQ(p.tool_choice().function(), "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  const auto& ms = p.messages().messages();
  ASSERT_EQ(ms.size(), 3);
  ASSERT_EQ(ms[1].tool_calls_size(), 1);
  EXPECT_EQ(ms[1].tool_calls(0).arguments(), R"({"city": "Paris"})");
  EXPECT_EQ(ms[2].role(), "tool");
  EXPECT_EQ(ms[2].tool_call_id(), "call_1");
  for (const char* mode : {"auto", "none", "required"}) {
    const OpenAiRequest m =
        Parse(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": ")", mode,
                           R"(", "tools": [{"type": "function", "function": {"name": "f"}}]})"));
    EXPECT_EQ(v1::ToolChoice::Mode_Name(m.prompts[0].tool_choice().mode()), absl::AsciiStrToUpper(mode));
  }
}

TEST(OpenAiRequest, RefusalsNameTheField) {
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "tools": "all"})").find("tools"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"prompt": "x", "tools": []})", OpenAiRoute::kCompletion, true).find("tools"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"five": 1}})")
                .find("logit_bias[\"five\"]"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})").find("max_tokens"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "n": 0})").find("n = 0"), std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})").find("top_logprobs"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {}})").find("stream_options"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "robot", "content": "x"}]})").find("messages[0].role"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x", "audio": {}}]})").find("messages[0].audio"),
            std::string::npos);
  EXPECT_NE(
      Refusal(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})").find("messages[0].tool_calls"),
      std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": null}]})").find("messages[0].content"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
      "max_completion_tokens": 6})")
                .find("max_completion_tokens"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"prompt": [[1, -2]]})", OpenAiRoute::kCompletion).find("prompt[0][1]"), std::string::npos);
  EXPECT_NE(Refusal(R"({"prompt": "x", "echo": 3})", OpenAiRoute::kCompletion).find("echo"), std::string::npos);
  EXPECT_NE(Refusal(R"({"prompt": "x", "speculative": "no"})", OpenAiRoute::kCompletion).find("speculative"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "echo": true})").find("echo"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"prompt": ["a", "b"], "n": 100})", OpenAiRoute::kCompletion).find("at most 128"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "whatever": 1})", OpenAiRoute::kChat, true)
                .find("whatever"),
            std::string::npos);
  EXPECT_NE(Refusal("{").find("not valid JSON"), std::string::npos);
}

// Fields inferd does not know are ignored and listed (at most kMaxListedFields of them); the routers' own fields
// are honoured, ignored at values that change nothing, or refused where they ask for what inferd does not do.
TEST(OpenAiRequest, UnknownFieldsAreListedAndRouterFieldsHandled) {
  OpenAiRequest r = Parse(R"({"messages": [{"role": "user", "content": "x"}], "whatever": 1, "z": null,
                              "no_stop_trim": true, "rid": "r-1", "separate_reasoning": true, "stream_reasoning": false,
                              "continue_final_message": false, "return_hidden_states": false})");
  EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"whatever", "z"}));
  EXPECT_FALSE(r.stream_reasoning || !r.separate_reasoning);
  EXPECT_TRUE(r.prompts[0].stopping().include_stop_str_in_output());
  EXPECT_EQ(r.prompts[0].request_id(), "r-1");
  std::string many = R"({"prompt": "x")";
  for (int i = 0; i < 40; ++i) many += absl::StrCat(R"(, "f)", i, R"(": 0)");
  r = Parse(many + "}", OpenAiRoute::kCompletion);
  EXPECT_EQ(static_cast<int>(r.ignored_fields.size()), kMaxListedFields);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})")
                .find("continue_final_message"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "rid": 5})").find("rid"), std::string::npos);
  EXPECT_NE(Refusal(R"({"prompt": "x", "lora_path": "adapter"})", OpenAiRoute::kCompletion).find("lora_path"),
            std::string::npos);
  EXPECT_TRUE(ParseOpenAiRequest(R"({"prompt": "x", "chat_template_kwargs": {}})", OpenAiRoute::kCompletion).ok());
}

}  // namespace
}  // namespace inferd

#include "server/http/openai_response.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace inferd {
namespace {

using json = nlohmann::json;

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A token as OpenAI shows it: its text (a byte that is not whole UTF-8 by itself shows as U+FFFD) and its bytes.
json TokenJson(const Tokenizer* tokenizer, int32_t id, float logprob) {
  const std::string bytes = tokenizer ? tokenizer->TokenBytes(id, /*skip_special_tokens=*/false) : std::string();
  json b = json::array();
  for (unsigned char c : bytes) b.push_back(c);
  return {{"token", bytes}, {"logprob", logprob}, {"bytes", std::move(b)}};
}

json ChatLogprobs(const OpenAiResponseContext& ctx, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    json t = TokenJson(ctx.tokenizer, lp.token_id, lp.logprob);
    json top = json::array();
    for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < ctx.top_logprobs; ++k) {
      top.push_back(TokenJson(ctx.tokenizer, lp.top[k].token_id, lp.top[k].logprob));
    }
    t["top_logprobs"] = std::move(top);
    content.push_back(std::move(t));
  }
  return {{"content", std::move(content)}};
}

json CompletionLogprobs(const OpenAiResponseContext& ctx, const std::vector<TokenLogprob>& lps) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  int64_t offset = 0;
  for (const TokenLogprob& lp : lps) {
    const std::string text = ctx.tokenizer ? ctx.tokenizer->TokenBytes(lp.token_id, false) : std::string();
    tokens.push_back(text);
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
    if (std::isnan(lp.logprob)) {  // an echoed prompt's first token: nothing before it to score it
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(lp.logprob);
    json alternatives = json::object();
    for (size_t k = 0; k < lp.top.size() && static_cast<int>(k) < ctx.top_logprobs; ++k) {
      alternatives[ctx.tokenizer ? ctx.tokenizer->TokenBytes(lp.top[k].token_id, false) : std::string()] =
          lp.top[k].logprob;
    }
    top.push_back(std::move(alternatives));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json Logprobs(const OpenAiResponseContext& ctx, const std::vector<TokenLogprob>& lps) {
  if (!ctx.logprobs) return nullptr;
  return ctx.route == OpenAiRoute::kChat ? ChatLogprobs(ctx, lps) : CompletionLogprobs(ctx, lps);
}

json Finish(const ChoicePiece& c) {
  if ((!c.tool_calls.empty() || c.called) && c.finish != FinishReason::kNone && c.finish != FinishReason::kLength &&
      c.finish != FinishReason::kAborted) {
    return "tool_calls";
  }
  const char* name = OpenAiFinishReason(c.finish);
  return name ? json(name) : json(nullptr);
}

json ToolCallsJson(const std::vector<ChatToolCall>& calls) {
  json list = json::array();
  for (const ChatToolCall& c : calls) {
    list.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return list;
}

json UsageJson(const UsageTotals& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json Head(const OpenAiResponseContext& ctx, bool chunk) {
  const bool chat = ctx.route == OpenAiRoute::kChat;
  return {{"id", ctx.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model}};
}

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json ErrorJson(const absl::Status& status, int http) {
  return {
      {"error",
       {{"message", std::string(status.message())}, {"type", ErrorType(http)}, {"param", nullptr}, {"code", http}}}};
}

}  // namespace

const char* OpenAiFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return nullptr;
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
    case FinishReason::kStopString:
    case FinishReason::kStopToken:
      return "stop";
    case FinishReason::kAborted:
      return "abort";
  }
  return nullptr;
}

std::string OpenAiResponse(const OpenAiResponseContext& ctx, const std::vector<ChoicePiece>& choices,
                           const UsageTotals& usage) {
  json out = Head(ctx, false);
  json list = json::array();
  for (const ChoicePiece& c : choices) {
    json choice = {{"index", c.index}, {"logprobs", Logprobs(ctx, c.logprobs)}, {"finish_reason", Finish(c)}};
    if (ctx.route == OpenAiRoute::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = nullptr;  // as OpenAI answers a call without text
        choice["message"]["tool_calls"] = ToolCallsJson(c.tool_calls);
      }
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string OpenAiChunkEvent(const OpenAiResponseContext& ctx, const ChoicePiece& piece) {
  json out = Head(ctx, true);
  json choice = {{"index", piece.index}, {"logprobs", Logprobs(ctx, piece.logprobs)}, {"finish_reason", Finish(piece)}};
  if (ctx.route == OpenAiRoute::kChat) {
    json delta = {{"content", piece.text}};
    if (!piece.reasoning.empty()) {
      delta["reasoning_content"] = piece.reasoning;
      if (piece.text.empty()) delta.erase("content");
    }
    if (piece.first) delta["role"] = "assistant";
    if (!piece.tool_call_deltas.empty()) {
      json list = json::array();
      for (const ToolCallChunk& d : piece.tool_call_deltas) {
        json call = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
        if (!d.id.empty()) {
          call["id"] = d.id;
          call["type"] = "function";
          call["function"]["name"] = d.name;
        }
        list.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(list);
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = piece.text;
  }
  out["choices"] = json::array({std::move(choice)});
  return "data: " + Dump(out) + "\n\n";
}

std::string OpenAiUsageEvent(const OpenAiResponseContext& ctx, const UsageTotals& usage) {
  json out = Head(ctx, true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return "data: " + Dump(out) + "\n\n";
}

int OpenAiHttpStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

std::string OpenAiErrorBody(const absl::Status& status) {
  return Dump(ErrorJson(status, OpenAiHttpStatus(status)));
}

std::string OpenAiErrorBody(const absl::Status& status, int http_status) {
  return Dump(ErrorJson(status, http_status));
}

std::string OpenAiErrorEvent(const absl::Status& status) {
  return "data: " + Dump(ErrorJson(status, OpenAiHttpStatus(status))) + "\n\n";
}

}  // namespace inferd

#include "server/request_builder.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "engine/chat/reasoning.h"
#include "engine/chat/tool_calls.h"
#include "engine/json_depth.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/utf8.h"

namespace inferd {
namespace {

absl::Status Bad(const std::string& field, const std::string& value, const std::string& allowed) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " is not allowed; allowed: ", allowed));
}

absl::Status FloatIn(const char* field, float v, float lo, float hi, bool lo_open, float* out) {
  if (!std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo)) {
    return Bad(field, std::isnan(v) ? "nan" : absl::StrCat(v), absl::StrCat(lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

// The API's constraint as the engine's, each kind named by its field for errors.
OutputConstraint ConstraintOf(const v1::OutputConstraint& c) {
  using Kind = OutputConstraint::Kind;
  switch (c.kind_case()) {
    case v1::OutputConstraint::kJsonSchema:
      return {Kind::kJsonSchema, c.json_schema(), {}, "constraint.json_schema"};
    case v1::OutputConstraint::kJsonObject:
      return {c.json_object() ? Kind::kJsonObject : Kind::kNone, "", {}, "constraint.json_object"};
    case v1::OutputConstraint::kRegex:
      return {Kind::kRegex, c.regex(), {}, "constraint.regex"};
    case v1::OutputConstraint::kGrammar:
      return {Kind::kGrammar, c.grammar(), {}, "constraint.grammar"};
    case v1::OutputConstraint::kChoice:
      return {Kind::kChoice, "", {c.choice().choices().begin(), c.choice().choices().end()}, "constraint.choice"};
    case v1::OutputConstraint::KIND_NOT_SET:
      break;
  }
  return {Kind::kNone, "", {}, "constraint"};
}

// A request's tools, checked: names as OpenAI allows them, parameters a JSON object.
absl::StatusOr<std::vector<ToolSpec>> ToolsOf(const v1::GenerateRequest& p) {
  if (p.tools_size() > kMaxTools) {
    return Bad("tools", absl::StrCat("(", p.tools_size(), " tools)"), absl::StrCat("at most ", kMaxTools));
  }
  std::vector<ToolSpec> tools;
  for (int i = 0; i < p.tools_size(); ++i) {
    const v1::Tool& t = p.tools(i);
    const std::string field = absl::StrCat("tools[", i, "]");
    const bool name_ok =
        !t.name().empty() && t.name().size() <= 64 && std::all_of(t.name().begin(), t.name().end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        });
    if (!name_ok) {
      return Bad(field + ".name", absl::StrCat("\"", t.name().substr(0, 64), "\""),
                 "1 to 64 letters, digits, underscores and dashes");
    }
    for (const ToolSpec& before : tools) {
      if (before.name == t.name())
        return Bad(field + ".name", absl::StrCat("\"", t.name(), "\""), "a name no other tool has");
    }
    if (!IsValidUtf8(t.description()) || !IsValidUtf8(t.parameters())) {
      return Bad(field, "(invalid UTF-8)", "valid UTF-8");
    }
    if (const int depth = JsonDepth(t.parameters()); depth > kMaxSchemaDepth) {
      return Bad(field + ".parameters", absl::StrCat("(nested ", depth, " levels deep)"),
                 absl::StrCat("at most ", kMaxSchemaDepth, " levels"));
    }
    if (!t.parameters().empty()) {
      const nlohmann::json params = nlohmann::json::parse(t.parameters(), nullptr, /*allow_exceptions=*/false);
      if (!params.is_object()) {
        return Bad(field + ".parameters", absl::StrCat("(", t.parameters().size(), " bytes)"), "a JSON schema object");
      }
    }
    tools.push_back({t.name(), t.description(), t.parameters()});
  }
  return tools;
}

// The conversation as the template reads it; with tools its template does not read, told of them in the system
// message.
absl::StatusOr<std::vector<ChatMessage>> ChatOf(const v1::GenerateRequest& p, const std::vector<ToolSpec>& tools,
                                                bool template_takes_tools) {
  const auto& ms = p.messages().messages();
  if (ms.empty()) return Bad("messages", "(empty)", "at least one message");
  std::vector<ChatMessage> chat;
  for (int i = 0; i < ms.size(); ++i) {
    const v1::ChatMessage& m = ms[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!IsValidUtf8(m.role()) || !IsValidUtf8(m.content()) || !IsValidUtf8(m.tool_call_id()) ||
        !IsValidUtf8(m.name())) {
      return Bad(field, "(invalid UTF-8)", "valid UTF-8");
    }
    if (m.role().empty()) return Bad(field + ".role", "\"\"", "a non-empty role");
    ChatMessage& c = chat.emplace_back(ChatMessage{m.role(), m.content(), {}, m.tool_call_id(), m.name()});
    for (int k = 0; k < m.tool_calls_size(); ++k) {
      const v1::ToolCall& call = m.tool_calls(k);
      if (!IsValidUtf8(call.id()) || !IsValidUtf8(call.name()) || !IsValidUtf8(call.arguments())) {
        return Bad(absl::StrCat(field, ".tool_calls[", k, "]"), "(invalid UTF-8)", "valid UTF-8");
      }
      c.tool_calls.push_back({call.id(), call.name(), call.arguments()});
    }
  }
  if (!tools.empty() && !template_takes_tools) {
    const std::string prompt = ToolsSystemPrompt(tools);
    if (chat[0].role == "system") {
      chat[0].content += "\n\n" + prompt;
    } else {
      chat.insert(chat.begin(), ChatMessage{"system", prompt});
    }
  }
  return chat;
}

}  // namespace

absl::StatusOr<BuiltRequest> BuildRequest(const v1::GenerateRequest& p, const ModelLimits& limits) {
  BuiltRequest built;
  Request& r = built.request;
  TextOptions& text = built.text;
  // Where a thinking model's output stands towards its reasoning (messages through a template that thinks).
  OutputConstraint::Reasoning reasoning = OutputConstraint::Reasoning::kNone;
  r.id = p.request_id();
  if (!IsValidUtf8(r.id)) return Bad("request_id", "(invalid UTF-8)", "valid UTF-8");
  if (r.id.size() > 256) return Bad("request_id", absl::StrCat("(", r.id.size(), " bytes)"), "at most 256 bytes");

  const bool add_special = !p.output().has_add_special_tokens() || p.output().add_special_tokens();
  INFERD_ASSIGN_OR_RETURN(const std::vector<ToolSpec> tools, ToolsOf(p));
  if (!tools.empty() && p.prompt_case() != v1::GenerateRequest::kMessages) {
    return Bad("tools", absl::StrCat("(", tools.size(), " tools)"), "none unless the prompt is messages");
  }
  const v1::ToolChoice& choice = p.tool_choice();
  if (tools.empty() && p.has_tool_choice() && choice.mode() != v1::ToolChoice::NONE) {
    return Bad("tool_choice", v1::ToolChoice::Mode_Name(choice.mode()), "NONE, or tools to choose from");
  }
  switch (p.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (!IsValidUtf8(p.text())) return Bad("text", "(invalid UTF-8)", "valid UTF-8");
      r.prompt = limits.tokenizer->Encode(p.text(), add_special);
      break;
    case v1::GenerateRequest::kTokenIds:
      for (int i = 0; i < p.token_ids().ids_size(); ++i) {
        const int32_t id = p.token_ids().ids(i);
        if (id < 0 || id >= limits.vocab_size) {
          return Bad(absl::StrCat("token_ids.ids[", i, "]"), absl::StrCat(id),
                     absl::StrCat("[0, ", limits.vocab_size, ")"));
        }
        r.prompt.push_back(id);
      }
      break;
    case v1::GenerateRequest::kMessages: {
      if (!limits.chat_template) {
        return absl::InvalidArgumentError("messages: this model has no chat template; send text or token_ids");
      }
      const bool takes_tools = limits.chat_template->takes_tools();
      INFERD_ASSIGN_OR_RETURN(std::vector<ChatMessage> chat, ChatOf(p, tools, takes_tools));
      auto text = limits.chat_template->Render(chat, /*add_generation_prompt=*/true,
                                               takes_tools && !tools.empty() ? ToolsJson(tools) : "");
      if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("messages: ", text.status().message()));
      r.prompt = limits.tokenizer->Encode(*text, /*add_special_tokens=*/false);
      if (limits.chat_template->thinks()) {
        built.text.reasoning = PromptOpensReasoning(*text);
        // A constraint holds for the answer after the reasoning (engine.structured_output_in_reasoning aside).
        reasoning = *built.text.reasoning          ? OutputConstraint::Reasoning::kOpened
                    : PromptClosesReasoning(*text) ? OutputConstraint::Reasoning::kNone
                                                   : OutputConstraint::Reasoning::kMayOpen;
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("prompt is missing: set text, token_ids or messages");
  }
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt is empty: it must have at least one token");

  const v1::SamplingParams& s = p.sampling();
  SamplingParams& sp = r.sampling;
  absl::Status st;
  if (s.has_temperature() &&
      !(st = FloatIn("sampling.temperature", s.temperature(), 0, 100, false, &sp.temperature)).ok())
    return st;
  if (s.has_top_p() && !(st = FloatIn("sampling.top_p", s.top_p(), 0, 1, true, &sp.top_p)).ok()) return st;
  if (s.has_min_p() && !(st = FloatIn("sampling.min_p", s.min_p(), 0, 1, false, &sp.min_p)).ok()) return st;
  if (s.has_repetition_penalty() &&
      !(st = FloatIn("sampling.repetition_penalty", s.repetition_penalty(), 0, 10, true, &sp.repetition_penalty)).ok())
    return st;
  if (s.has_presence_penalty() &&
      !(st = FloatIn("sampling.presence_penalty", s.presence_penalty(), -2, 2, false, &sp.presence_penalty)).ok())
    return st;
  if (s.has_frequency_penalty() &&
      !(st = FloatIn("sampling.frequency_penalty", s.frequency_penalty(), -2, 2, false, &sp.frequency_penalty)).ok())
    return st;
  if (s.has_top_k()) {
    if (s.top_k() < 0 || s.top_k() > limits.vocab_size) {
      return Bad("sampling.top_k", absl::StrCat(s.top_k()), absl::StrCat("[0, ", limits.vocab_size, "]"));
    }
    sp.top_k = s.top_k();
  }
  if (s.has_seed()) sp.seed = s.seed();
  if (s.logit_bias_size() > kMaxLogitBias) {
    return Bad("sampling.logit_bias", absl::StrCat("(", s.logit_bias_size(), " entries)"),
               absl::StrCat("at most ", kMaxLogitBias, " entries"));
  }
  for (const auto& [id, bias] : s.logit_bias()) {
    if (id < 0 || id >= limits.vocab_size) {
      return Bad("sampling.logit_bias", absl::StrCat("{", id, ": ...}"),
                 absl::StrCat("token ids in [0, ", limits.vocab_size, ")"));
    }
    float checked = 0;
    if (absl::Status st =
            FloatIn(absl::StrCat("sampling.logit_bias[", id, "]").c_str(), bias, -100, 100, false, &checked);
        !st.ok()) {
      return st;
    }
    sp.logit_bias.emplace_back(id, checked);
  }
  std::sort(sp.logit_bias.begin(), sp.logit_bias.end());

  const int32_t prompt_len = static_cast<int32_t>(r.prompt.size());
  if (prompt_len >= limits.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", prompt_len, " tokens; allowed: fewer than max_model_len = ", limits.max_model_len,
                     " so that one token can be generated"));
  }
  const v1::StoppingParams& t = p.stopping();
  StoppingParams& stop = r.stopping;
  stop.max_tokens = limits.max_model_len - prompt_len;
  if (t.has_max_tokens()) {
    if (t.max_tokens() < 1) return Bad("stopping.max_tokens", absl::StrCat(t.max_tokens()), ">= 1");
    if (t.max_tokens() > limits.max_model_len - prompt_len) {
      return absl::InvalidArgumentError(absl::StrCat("stopping.max_tokens = ", t.max_tokens(), " plus the prompt's ",
                                                     prompt_len,
                                                     " tokens exceeds max_model_len = ", limits.max_model_len,
                                                     "; allowed: max_tokens <= ", limits.max_model_len - prompt_len));
    }
    stop.max_tokens = t.max_tokens();
  }
  if (t.has_min_tokens()) {
    if (t.min_tokens() < 0 || t.min_tokens() > stop.max_tokens) {
      return Bad("stopping.min_tokens", absl::StrCat(t.min_tokens()),
                 absl::StrCat("[0, max_tokens = ", stop.max_tokens, "]"));
    }
    stop.min_tokens = t.min_tokens();
  }
  // Stop strings are checked after every token on the output path: their number and size are bounded.
  if (t.stop_size() > kMaxStopStrings) {
    return Bad("stopping.stop", absl::StrCat(t.stop_size(), " strings"), absl::StrCat("at most ", kMaxStopStrings));
  }
  for (int i = 0; i < t.stop_size(); ++i) {
    const std::string& s = t.stop(i);
    if (s.empty()) return Bad(absl::StrCat("stopping.stop[", i, "]"), "\"\"", "a non-empty string");
    if (s.size() > kMaxStopStringBytes) {
      return Bad(absl::StrCat("stopping.stop[", i, "]"), absl::StrCat("(", s.size(), " bytes)"),
                 absl::StrCat("at most ", kMaxStopStringBytes, " bytes"));
    }
    if (!IsValidUtf8(s)) return Bad(absl::StrCat("stopping.stop[", i, "]"), "(invalid UTF-8)", "valid UTF-8");
    text.stop.push_back(s);
  }
  if (t.stop_token_ids_size() > kMaxStopTokenIds) {
    return Bad("stopping.stop_token_ids", absl::StrCat(t.stop_token_ids_size(), " ids"),
               absl::StrCat("at most ", kMaxStopTokenIds));
  }
  for (int i = 0; i < t.stop_token_ids_size(); ++i) {
    const int32_t id = t.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Bad(absl::StrCat("stopping.stop_token_ids[", i, "]"), absl::StrCat(id),
                 absl::StrCat("[0, ", limits.vocab_size, ")"));
    }
    stop.stop_token_ids.push_back(id);
  }
  stop.ignore_eos = t.ignore_eos();
  text.include_stop_str_in_output = t.include_stop_str_in_output();
  text.min_tokens = stop.min_tokens;

  if (p.output().has_top_logprobs()) {
    if (p.output().top_logprobs() < 0 || p.output().top_logprobs() > 20) {
      return Bad("output.top_logprobs", absl::StrCat(p.output().top_logprobs()), "[0, 20]");
    }
    r.top_logprobs = p.output().top_logprobs();
  }
  if (p.output().has_prompt_logprobs()) {
    if (p.output().prompt_logprobs() < 0 || p.output().prompt_logprobs() > 20) {
      return Bad("output.prompt_logprobs", absl::StrCat(p.output().prompt_logprobs()), "[0, 20]");
    }
    r.prompt_logprobs = p.output().prompt_logprobs();
  }
  text.skip_special_tokens = !p.output().has_skip_special_tokens() || p.output().skip_special_tokens();
  r.priority = p.priority();
  r.speculative = !p.no_speculation();
  // Tools: the calls are found in the text unless the request forbids them; a required call is a constraint.
  OutputConstraint c = ConstraintOf(p.constraint());
  c.reasoning = reasoning;
  if (!tools.empty() && choice.mode() != v1::ToolChoice::NONE) {
    const ToolCallFormat format = limits.chat_template->tool_call_format();
    text.tool_calls = format;
    if (choice.mode() == v1::ToolChoice::FUNCTION &&
        std::none_of(tools.begin(), tools.end(), [&](const ToolSpec& t) { return t.name == choice.function(); })) {
      return Bad("tool_choice.function", absl::StrCat("\"", choice.function().substr(0, 64), "\""),
                 "the name of one of the request's tools");
    }
    if (choice.mode() == v1::ToolChoice::REQUIRED || choice.mode() == v1::ToolChoice::FUNCTION) {
      if (c.active()) return Bad("constraint", "(set)", "unset when tool_choice requires a call");
      const ToolCallShape shape =
          ForcedToolCall(format, tools, choice.mode() == v1::ToolChoice::FUNCTION ? choice.function() : "");
      c = {OutputConstraint::Kind::kToolCall, shape.schema, {}, "tool_choice", shape.prefix, shape.suffix, reasoning};
    }
  }
  // Compiled here, on the request's thread: the engine's thread never waits for it.
  if (c.active()) {
    if (!limits.constraints) return absl::InternalError("constraint: this server has no constraint compiler");
    // Once a constraint is complete only the end-of-text tokens may follow, which min_tokens would forbid.
    if (r.stopping.min_tokens > 0) {
      return Bad("stopping.min_tokens", absl::StrCat(r.stopping.min_tokens), "0 with an output constraint");
    }
    INFERD_ASSIGN_OR_RETURN(r.constraint, limits.constraints->Compile(c));
  }
  return built;
}

}  // namespace inferd

#include "server/http/openai_request.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/bounded_json.h"

namespace inferd {
namespace {

using json = nlohmann::json;

absl::Status Bad(const std::string& field, const json& value, const std::string& allowed) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", Preview(value), " is not allowed; allowed: ", allowed));
}

absl::Status Unsupported(const std::string& field) {
  return absl::InvalidArgumentError(absl::StrCat(field, " is not supported by inferd; leave it out"));
}

// A field the client named: at most a short prefix of the name is shown.
std::string ClientKey(const std::string& key) {
  return key.size() <= 64 ? key : Preview(std::string_view(key), 64);
}

// The body's fields, checked one by one as they are taken; what is left at the end is unknown.
class Fields {
 public:
  explicit Fields(json body) : body_(std::move(body)) {}

  bool Has(const char* key) const { return body_.contains(key) && !body_.at(key).is_null(); }
  const json& At(const char* key) const { return body_.at(key); }
  void Done(const char* key) { body_.erase(key); }
  const json& Rest() const { return body_; }

  absl::Status Float(const char* key, v1::SamplingParams* s, void (v1::SamplingParams::*set)(float)) {
    if (!Has(key)) return Take(key);
    if (!At(key).is_number()) return Bad(key, At(key), "a number");
    const double v = At(key).get<double>();
    if (!std::isfinite(v) || std::abs(v) > 1e30) return Bad(key, At(key), "a finite number");
    (s->*set)(static_cast<float>(v));
    return Take(key);
  }
  absl::StatusOr<std::optional<int64_t>> Int(const char* key, int64_t lo, int64_t hi) {
    if (!Has(key)) {
      Done(key);
      return std::optional<int64_t>();
    }
    const json& v = At(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
        v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      return Bad(key, v, absl::StrCat("an integer in [", lo, ", ", hi, "]"));
    }
    const int64_t out = v.get<int64_t>();
    Done(key);
    return std::optional<int64_t>(out);
  }
  absl::StatusOr<std::optional<bool>> Bool(const char* key) {
    if (!Has(key)) {
      Done(key);
      return std::optional<bool>();
    }
    if (!At(key).is_boolean()) return Bad(key, At(key), "true or false");
    const bool out = At(key).get<bool>();
    Done(key);
    return std::optional<bool>(out);
  }

 private:
  absl::Status Take(const char* key) {
    Done(key);
    return absl::OkStatus();
  }
  json body_;
};

absl::Status TokenIds(const json& ids, const std::string& field, v1::GenerateRequest* r) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 ||
        ids[i].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Bad(absl::StrCat(field, "[", i, "]"), ids[i], "a token id");
    }
    r->mutable_token_ids()->add_ids(ids[i].get<int32_t>());
  }
  if (ids.empty()) return Bad(field, ids, "at least one token id");
  return absl::OkStatus();
}

absl::Status Prompts(const json& prompt, std::vector<v1::GenerateRequest>* out) {
  if (prompt.is_string()) {
    out->emplace_back().set_text(prompt.get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt.is_array() || prompt.empty()) {
    return Bad("prompt", prompt, "a string, a list of strings, a list of token ids, or a list of such lists");
  }
  if (prompt[0].is_number_integer()) return TokenIds(prompt, "prompt", &out->emplace_back());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string field = absl::StrCat("prompt[", i, "]");
    if (prompt[i].is_string()) {
      out->emplace_back().set_text(prompt[i].get<std::string>());
    } else if (prompt[i].is_array()) {
      if (absl::Status st = TokenIds(prompt[i], field, &out->emplace_back()); !st.ok()) return st;
    } else {
      return Bad(field, prompt[i], "a string or a list of token ids");
    }
  }
  return absl::OkStatus();
}

// A message's content: a string, or a list of text parts (joined).
absl::StatusOr<std::string> Content(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return Bad(field, content, "a string or a list of {\"type\": \"text\", \"text\": ...} parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string pf = absl::StrCat(field, "[", j, "]");
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string() || part.size() != 2) {
      return Bad(pf, part, "{\"type\": \"text\", \"text\": STRING} (inferd serves text only)");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant's tool_calls: [{"id", "type": "function", "function": {"name", "arguments": JSON text}}].
absl::Status ToolCalls(const json& calls, const std::string& field, v1::ChatMessage* out) {
  if (!calls.is_array()) return Bad(field, calls, "a list of tool calls");
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string cf = absl::StrCat(field, "[", k, "]");
    const char* allowed = R"({"id": STRING, "type": "function", "function": {"name": STRING, "arguments": STRING}})";
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) return Bad(cf, c, allowed);
    const json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string())
      return Bad(cf + ".function.name", f.value("name", json()), "a string");
    v1::ToolCall* call = out->add_tool_calls();
    call->set_name(f["name"].get<std::string>());
    if (c.contains("id") && c["id"].is_string()) call->set_id(c["id"].get<std::string>());
    if (f.contains("arguments")) {
      if (f["arguments"].is_string()) {
        call->set_arguments(f["arguments"].get<std::string>());
      } else if (f["arguments"].is_object()) {
        call->set_arguments(f["arguments"].dump());
      } else {
        return Bad(cf + ".function.arguments", f["arguments"], "a JSON object as a string");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Messages(const json& messages, v1::GenerateRequest* r) {
  if (!messages.is_array() || messages.empty()) return Bad("messages", messages, "a non-empty list of messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(field, m, "an object with role and content");
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content" && key != "tool_calls" && key != "tool_call_id" && key != "name" &&
          key != "refusal") {
        return Unsupported(absl::StrCat(field, ".", ClientKey(key)));
      }
    }
    if (!m.contains("role") || !m["role"].is_string()) return Bad(field + ".role", m.value("role", json()), "a string");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool") {
      return Bad(field + ".role", m["role"], "system, developer, user, assistant or tool");
    }
    v1::ChatMessage* out = r->mutable_messages()->add_messages();
    out->set_role(role == "developer" ? "system" : role);
    // An assistant that called tools may have no content (null, or none at all).
    const bool calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null();
    const bool content = m.contains("content") && !m["content"].is_null();
    if (!content && !calls)
      return Bad(field + ".content", m.value("content", json()), "a string or a list of text parts");
    if (content) {
      auto content = Content(m["content"], field + ".content");
      if (!content.ok()) return content.status();
      out->set_content(*std::move(content));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (role != "assistant") return Bad(field + ".tool_calls", m["tool_calls"], "only in an assistant's message");
      if (absl::Status st = ToolCalls(m["tool_calls"], field + ".tool_calls", out); !st.ok()) return st;
    }
    for (const char* key : {"tool_call_id", "name"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) return Bad(absl::StrCat(field, ".", key), m[key], "a string");
      key == std::string("name") ? out->set_name(m[key].get<std::string>())
                                 : out->set_tool_call_id(m[key].get<std::string>());
    }
  }
  return absl::OkStatus();
}

// tools ([{"type": "function", "function": {"name", "description", "parameters", "strict"}}]), tool_choice
// ("auto", "none", "required" or {"type": "function", "function": {"name"}}) and parallel_tool_calls.
absl::Status Tools(Fields& f, v1::GenerateRequest* r, bool* parallel_tool_calls) {
  if (f.Has("tools")) {
    const json& tools = f.At("tools");
    if (!tools.is_array()) return Bad("tools", tools, "a list of function tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      const std::string field = absl::StrCat("tools[", i, "]");
      const char* allowed =
          R"({"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}})";
      if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
          !t["function"].is_object()) {
        return Bad(field, t, allowed);
      }
      const json& fn = t["function"];
      for (const auto& [key, value] : fn.items()) {
        if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
          return Bad(absl::StrCat(field, ".function.", ClientKey(key)), value, "name, description, parameters, strict");
        }
      }
      if (!fn.contains("name") || !fn["name"].is_string()) {
        return Bad(field + ".function.name", fn.value("name", json()), "a string");
      }
      v1::Tool* tool = r->add_tools();
      tool->set_name(fn["name"].get<std::string>());
      if (fn.contains("description") && !fn["description"].is_null()) {
        if (!fn["description"].is_string()) return Bad(field + ".function.description", fn["description"], "a string");
        tool->set_description(fn["description"].get<std::string>());
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null()) {
        if (!fn["parameters"].is_object())
          return Bad(field + ".function.parameters", fn["parameters"], "a JSON schema object");
        tool->set_parameters(fn["parameters"].dump());
      }
    }
  }
  f.Done("tools");
  if (f.Has("tool_choice")) {
    const json& c = f.At("tool_choice");
    v1::ToolChoice* choice = r->mutable_tool_choice();
    const char* allowed = R"("auto", "none", "required" or {"type": "function", "function": {"name": ...}})";
    if (c == "auto") {
      choice->set_mode(v1::ToolChoice::AUTO);
    } else if (c == "none") {
      choice->set_mode(v1::ToolChoice::NONE);
    } else if (c == "required") {
      choice->set_mode(v1::ToolChoice::REQUIRED);
    } else if (c.is_object() && c.value("type", json()) == "function" && c.contains("function") &&
               c["function"].is_object() && c["function"].contains("name") && c["function"]["name"].is_string()) {
      choice->set_mode(v1::ToolChoice::FUNCTION);
      choice->set_function(c["function"]["name"].get<std::string>());
    } else {
      return Bad("tool_choice", c, allowed);
    }
  }
  f.Done("tool_choice");
  // Calls may come several to an answer; one forced by tool_choice comes alone.
  auto parallel = f.Bool("parallel_tool_calls");
  if (!parallel.ok()) return parallel.status();
  *parallel_tool_calls = parallel->value_or(true);
  return absl::OkStatus();
}

}  // namespace

namespace {

// Structured output: OpenAI's response_format ({"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}) or vLLM's structured_outputs (one of json, regex,
// grammar, choice), at most one of them.
absl::Status Constraint(Fields& f, v1::OutputConstraint* out, std::string* field_out) {
  const bool has_format = f.Has("response_format"), has_structured = f.Has("structured_outputs");
  if (has_format && has_structured) {
    return Bad("structured_outputs", f.At("structured_outputs"), "absent when response_format is given");
  }
  if (has_format) {
    const json& rf = f.At("response_format");
    const std::string type =
        rf.is_object() && rf.contains("type") && rf["type"].is_string() ? rf["type"].get<std::string>() : "";
    const char* allowed =
        R"({"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}})";
    if (type == "json_schema") {
      const json& js = rf.contains("json_schema") ? rf["json_schema"] : json();
      if (!js.is_object() || !js.contains("schema") || !js["schema"].is_object()) {
        return Bad("response_format.json_schema", js, "an object with a schema object");
      }
      for (const auto& [key, value] : js.items()) {
        if (key != "name" && key != "schema" && key != "strict" && key != "description") {
          return Bad(absl::StrCat("response_format.json_schema.", Preview(std::string_view(key), 24)), value,
                     "name, schema, strict, description");
        }
      }
      out->set_json_schema(js["schema"].dump());
      *field_out = "response_format.json_schema.schema";
    } else if (type == "json_object" && rf.size() == 1) {
      out->set_json_object(true);
      *field_out = "response_format";
    } else if (type != "text" || rf.size() != 1) {
      return Bad("response_format", rf, allowed);
    }
  }
  f.Done("response_format");
  if (has_structured) {
    const json& so = f.At("structured_outputs");
    const char* allowed = "an object with one of json (a schema), regex, grammar or choice";
    if (!so.is_object() || so.size() != 1) return Bad("structured_outputs", so, allowed);
    const std::string key = so.begin().key();
    const json& value = so.begin().value();
    if (key != "json" && key != "regex" && key != "grammar" && key != "choice") {
      return Bad("structured_outputs", so, allowed);
    }
    const std::string field = absl::StrCat("structured_outputs.", key);
    *field_out = field;
    if (key == "json") {
      if (value.is_string()) {  // a schema given as text, as vLLM takes it
        out->set_json_schema(value.get<std::string>());
      } else if (value.is_object()) {
        out->set_json_schema(value.dump());
      } else {
        return Bad(field, value, "a JSON schema (an object, or its text)");
      }
    } else if (key == "regex" || key == "grammar") {
      if (!value.is_string()) return Bad(field, value, "a string");
      key == "regex" ? out->set_regex(value.get<std::string>()) : out->set_grammar(value.get<std::string>());
    } else if (key == "choice") {
      if (!value.is_array() || value.empty()) return Bad(field, value, "a non-empty list of strings");
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string()) return Bad(absl::StrCat(field, "[", i, "]"), value[i], "a string");
        out->mutable_choice()->add_choices(value[i].get<std::string>());
      }
    } else {
      return Bad("structured_outputs", so, allowed);
    }
  }
  f.Done("structured_outputs");
  return absl::OkStatus();
}

}  // namespace

// Fields of vLLM's and SGLang's APIs that their routers and clients send (SGLang's router adds some to every
// request): honoured, ignored at the values that change nothing inferd does, or refused where the value asks for
// what inferd does not do.
absl::Status ExtensionFields(Fields& f, v1::GenerateRequest* base, OpenAiRequest* out) {
  auto no_trim = f.Bool("no_stop_trim");  // SGLang: keep the stop string in the output
  if (!no_trim.ok()) return no_trim.status();
  if (no_trim->value_or(false)) base->mutable_stopping()->set_include_stop_str_in_output(true);
  if (f.Has("rid")) {  // SGLang's request id
    if (!f.At("rid").is_string()) return Bad("rid", f.At("rid"), "a string");
    base->set_request_id(f.At("rid").get<std::string>());
  }
  f.Done("rid");
  // Booleans whose other value inferd cannot honour.
  for (auto [key, serves, why] : std::initializer_list<std::tuple<const char*, bool, const char*>>{
           {"continue_final_message", false, "false (inferd opens a new assistant turn)"},
           {"add_generation_prompt", true, "true (inferd opens the assistant's turn)"},
           {"return_hidden_states", false, "false (inferd does not return hidden states)"},
           {"return_tokens_as_token_ids", false, "false"},
           {"echo", false, "false (chat does not echo)"}}) {
    if (std::string(key) == "echo" && out->route != OpenAiRoute::kChat) continue;
    auto v = f.Bool(key);
    if (!v.ok()) return v.status();
    if (v->has_value() && **v != serves) return Bad(key, **v, why);
  }
  // The reasoning switches of SGLang (separate_reasoning, stream_reasoning) and vLLM (include_reasoning).
  for (auto [key, member] : std::initializer_list<std::pair<const char*, bool OpenAiRequest::*>>{
           {"separate_reasoning", &OpenAiRequest::separate_reasoning},
           {"stream_reasoning", &OpenAiRequest::stream_reasoning},
           {"include_reasoning", &OpenAiRequest::include_reasoning}}) {
    auto v = f.Bool(key);
    if (!v.ok()) return v.status();
    out->*member = v->value_or(true);
  }
  // Objects and strings that ask for what inferd does not do: refused unless empty.
  for (const char* key : {"chat_template", "chat_template_kwargs", "documents", "lora_path", "lora_request",
                          "mm_processor_kwargs", "prompt_embeds"}) {
    if (f.Has(key) && !f.At(key).empty()) return Unsupported(key);
    f.Done(key);
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(std::string_view body, OpenAiRoute route, bool refuse_unknown) {
  absl::StatusOr<json> parsed = ParseBoundedJson(body, "the request body");
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) return Bad("the request body", *parsed, "one JSON object");
  Fields f(*std::move(parsed));
  OpenAiRequest out;
  out.route = route;
  const bool chat = route == OpenAiRoute::kChat;

  // What inferd does not serve, by name.
  for (const char* key : {"functions", "function_call", "audio", "modalities", "prediction", "web_search_options",
                          "suffix", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "reasoning_effort"}) {  // guided_*: structured_outputs
    if (f.Has(key)) return Unsupported(key);
    f.Done(key);
  }
  // Accepted and without effect on generation: who is asking, and whether OpenAI would store the answer.
  for (const char* key : {"user", "metadata", "store"}) f.Done(key);

  if (f.Has("model")) {
    if (!f.At("model").is_string()) return Bad("model", f.At("model"), "the served model's name");
    out.model = f.At("model").get<std::string>();
  }
  f.Done("model");

  v1::GenerateRequest base;
  if (absl::Status st = Constraint(f, base.mutable_constraint(), &out.constraint_field); !st.ok()) return st;
  if (chat) {
    if (!f.Has("messages")) return Bad("messages", json(), "a non-empty list of messages");
    if (absl::Status st = Messages(f.At("messages"), &base); !st.ok()) return st;
    f.Done("messages");
    if (absl::Status st = Tools(f, &base, &out.parallel_tool_calls); !st.ok()) return st;
  } else {
    if (!f.Has("prompt")) return Bad("prompt", json(), "a string, a list of strings or token ids");
    if (absl::Status st = Prompts(f.At("prompt"), &out.prompts); !st.ok()) return st;
    f.Done("prompt");
    auto echo = f.Bool("echo");
    if (!echo.ok()) return echo.status();
    out.echo = echo->value_or(false);
  }

  v1::SamplingParams* s = base.mutable_sampling();
  for (auto [key, set] : std::initializer_list<std::pair<const char*, void (v1::SamplingParams::*)(float)>>{
           {"temperature", &v1::SamplingParams::set_temperature},
           {"top_p", &v1::SamplingParams::set_top_p},
           {"min_p", &v1::SamplingParams::set_min_p},
           {"presence_penalty", &v1::SamplingParams::set_presence_penalty},
           {"frequency_penalty", &v1::SamplingParams::set_frequency_penalty},
           {"repetition_penalty", &v1::SamplingParams::set_repetition_penalty}}) {
    if (absl::Status st = f.Float(key, s, set); !st.ok()) return st;
  }
  if (f.Has("logit_bias")) {
    const json& lb = f.At("logit_bias");
    if (!lb.is_object()) return Bad("logit_bias", lb, "an object of token id (as a string) to a bias in [-100, 100]");
    for (const auto& [key, value] : lb.items()) {
      int32_t id = 0;
      const std::string field = absl::StrCat("logit_bias[", Preview(std::string_view(key), 24), "]");
      if (!absl::SimpleAtoi(key, &id) || id < 0) return Bad(field, key, "a token id");
      if (!value.is_number()) return Bad(field, value, "a number in [-100, 100]");
      (*s->mutable_logit_bias())[id] = value.get<float>();  // ranges: the request builder
    }
  }
  f.Done("logit_bias");
  auto top_k = f.Int("top_k", -1, std::numeric_limits<int32_t>::max());
  if (!top_k.ok()) return top_k.status();
  if (*top_k) s->set_top_k(**top_k < 0 ? 0 : static_cast<int32_t>(**top_k));  // -1: off, as vLLM takes it
  auto seed = f.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (!seed.ok()) return seed.status();
  if (*seed) s->set_seed(static_cast<uint64_t>(**seed));

  v1::StoppingParams* stop = base.mutable_stopping();
  auto max_tokens = f.Int("max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (!max_tokens.ok()) return max_tokens.status();
  auto max_completion = f.Int("max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
  if (!max_completion.ok()) return max_completion.status();
  if (*max_tokens && *max_completion && **max_tokens != **max_completion) {
    return Bad("max_completion_tokens", **max_completion,
               absl::StrCat("the same as max_tokens = ", **max_tokens, ", or only one of them"));
  }
  if (*max_completion) stop->set_max_tokens(static_cast<int32_t>(**max_completion));
  if (*max_tokens) stop->set_max_tokens(static_cast<int32_t>(**max_tokens));
  if (!chat && !stop->has_max_tokens()) stop->set_max_tokens(16);  // OpenAI's completions default
  auto min_tokens = f.Int("min_tokens", 0, std::numeric_limits<int32_t>::max());
  if (!min_tokens.ok()) return min_tokens.status();
  if (*min_tokens) stop->set_min_tokens(static_cast<int32_t>(**min_tokens));
  if (f.Has("stop")) {
    const json& st = f.At("stop");
    if (st.is_string()) {
      stop->add_stop(st.get<std::string>());
    } else if (st.is_array()) {
      for (size_t i = 0; i < st.size(); ++i) {
        if (!st[i].is_string()) return Bad(absl::StrCat("stop[", i, "]"), st[i], "a string");
        stop->add_stop(st[i].get<std::string>());
      }
    } else {
      return Bad("stop", st, "a string or a list of strings");
    }
  }
  f.Done("stop");
  if (f.Has("stop_token_ids")) {
    const json& ids = f.At("stop_token_ids");
    if (!ids.is_array()) return Bad("stop_token_ids", ids, "a list of token ids");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 ||
          ids[i].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Bad(absl::StrCat("stop_token_ids[", i, "]"), ids[i], "a token id");
      }
      stop->add_stop_token_ids(ids[i].get<int32_t>());
    }
  }
  f.Done("stop_token_ids");
  for (auto [key, set] : std::initializer_list<std::pair<const char*, void (v1::StoppingParams::*)(bool)>>{
           {"ignore_eos", &v1::StoppingParams::set_ignore_eos},
           {"include_stop_str_in_output", &v1::StoppingParams::set_include_stop_str_in_output}}) {
    auto v = f.Bool(key);
    if (!v.ok()) return v.status();
    if (*v) (stop->*set)(**v);
  }
  for (auto [key, set] : std::initializer_list<std::pair<const char*, void (v1::OutputOptions::*)(bool)>>{
           {"skip_special_tokens", &v1::OutputOptions::set_skip_special_tokens},
           {"add_special_tokens", &v1::OutputOptions::set_add_special_tokens}}) {
    auto v = f.Bool(key);
    if (!v.ok()) return v.status();
    if (*v) (base.mutable_output()->*set)(**v);
  }
  auto priority = f.Int("priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  if (!priority.ok()) return priority.status();
  if (*priority) base.set_priority(static_cast<int32_t>(**priority));
  auto speculative = f.Bool("speculative");  // inferd's: false opts out of speculative decoding
  if (!speculative.ok()) return speculative.status();
  if (*speculative) base.set_no_speculation(!**speculative);

  // Log probabilities: chat has logprobs (bool) and top_logprobs (0..20); completions logprobs (0..20).
  if (chat) {
    auto lp = f.Bool("logprobs");
    if (!lp.ok()) return lp.status();
    auto top = f.Int("top_logprobs", 0, 20);
    if (!top.ok()) return top.status();
    out.logprobs = lp->value_or(false);
    out.top_logprobs = static_cast<int>(top->value_or(0));
    if (*top && !out.logprobs) return Bad("top_logprobs", **top, "only with logprobs = true");
    // Every token's own logprob comes with its top alternatives: at least one is asked of the engine.
    if (out.logprobs)
      base.mutable_output()->set_top_logprobs(static_cast<int32_t>(std::max<int64_t>(1, top->value_or(0))));
  } else {
    auto lp = f.Int("logprobs", 0, 20);
    if (!lp.ok()) return lp.status();
    out.logprobs = lp->has_value();
    out.top_logprobs = static_cast<int>(lp->value_or(0));
    if (out.logprobs) base.mutable_output()->set_top_logprobs(static_cast<int32_t>(std::max<int64_t>(1, **lp)));
    // echo with logprobs: the prompt's tokens scored too, with as many alternatives.
    if (out.echo && out.logprobs) base.mutable_output()->set_prompt_logprobs(out.top_logprobs);
  }

  auto n = f.Int("n", 1, kMaxOpenAiChoices);
  if (!n.ok()) return n.status();
  out.n = static_cast<int>(n->value_or(1));
  auto best_of = f.Int("best_of", 1, kMaxOpenAiChoices);
  if (!best_of.ok()) return best_of.status();
  if (*best_of && **best_of != out.n) return Bad("best_of", **best_of, absl::StrCat("n = ", out.n, " or left out"));

  auto stream = f.Bool("stream");
  if (!stream.ok()) return stream.status();
  out.stream = stream->value_or(false);
  if (f.Has("stream_options")) {
    const json& so = f.At("stream_options");
    if (!out.stream) return Bad("stream_options", so, "only with stream = true");
    if (!so.is_object()) return Bad("stream_options", so, "{\"include_usage\": BOOL}");
    for (const auto& [key, value] : so.items()) {
      if (key != "include_usage" && key != "continuous_usage_stats") return Unsupported("stream_options." + key);
      if (!value.is_boolean()) return Bad("stream_options." + key, value, "true or false");
      if (key == "continuous_usage_stats" && value.get<bool>())
        return Unsupported("stream_options.continuous_usage_stats");
    }
    out.include_usage = so.value("include_usage", false);
  }
  f.Done("stream_options");

  if (absl::Status st = ExtensionFields(f, &base, &out); !st.ok()) return st;
  if (refuse_unknown && !f.Rest().empty()) return Unsupported(ClientKey(f.Rest().begin().key()));
  for (const auto& [key, value] : f.Rest().items()) {
    if (static_cast<int>(out.ignored_fields.size()) == kMaxListedFields) break;
    out.ignored_fields.push_back(ClientKey(key));
  }

  if (chat)
    out.prompts.push_back(std::move(base));
  else {
    for (v1::GenerateRequest& p : out.prompts) {
      v1::GenerateRequest merged = base;
      if (p.has_token_ids())
        *merged.mutable_token_ids() = p.token_ids();
      else
        merged.set_text(p.text());
      p = std::move(merged);
    }
  }
  if (static_cast<int64_t>(out.prompts.size()) * out.n > kMaxOpenAiChoices) {
    return Bad("n", out.n,
               absl::StrCat("at most ", kMaxOpenAiChoices, " choices in all (", out.prompts.size(), " prompts × n)"));
  }
  return out;
}

}  // namespace inferd

#include "server/http/openai_front_end.h"

#include <algorithm>
#include <ctime>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/chat/reasoning.h"
#include "server/http/bounded_json.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"
#include "server/proto_conversion.h"
#include "server/status_mapping.h"
#include "spdlog/spdlog.h"

namespace inferd {
namespace {

constexpr const char* kJson = "application/json";

void Fail(HttpExchange& exchange, const absl::Status& status) {
  exchange.Respond(OpenAiHttpStatus(status), kJson, OpenAiErrorBody(status));
}

// The fields a request carried that inferd ignored, as a response header (names reduced to letters, digits and
// "_.-", so that no client's bytes shape the header).
std::vector<std::pair<std::string, std::string>> IgnoredFieldsHeader(const OpenAiRequest& request) {
  if (request.ignored_fields.empty()) return {};
  std::string value;
  for (const std::string& name : request.ignored_fields) {
    if (!value.empty()) value += ", ";
    for (char c : name)
      value += absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ? c : '?';
  }
  return {{"X-Inferd-Ignored-Fields", value}};
}

// Logs each ignored field's name the first time it is seen (at most 256 names; later ones are counted only).
void LogIgnoredFields(const OpenAiRequest& request) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& name : request.ignored_fields) {
    if (seen.size() >= 256 || !seen.insert(name).second) continue;
    spdlog::warn(
        "http: request field '{}' is not one inferd knows: ignored (server.http_unknown_fields: refuse "
        "refuses such requests); later requests with it are counted in inferd_http_ignored_fields_total",
        absl::CHexEscape(name));
  }
}

std::string NewId(const char* prefix) {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%s-%016x%016x", prefix, absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

// One OpenAI request's choices (prompts × n), each a GenerateCall with its own emitter, answered together: a
// whole JSON response once every choice is done, or a stream whose events each carry one choice's piece.
class ChoiceSet : public std::enable_shared_from_this<ChoiceSet> {
 public:
  ChoiceSet(std::shared_ptr<HttpExchange> exchange, OpenAiRequest request, OpenAiResponseContext ctx,
            GenerateCall::Services services, std::shared_ptr<std::atomic<int64_t>> active_calls)
      : exchange_(std::move(exchange)),
        request_(std::move(request)),
        ctx_(std::move(ctx)),
        services_(std::move(services)),
        active_calls_(std::move(active_calls)) {}

  // Makes every choice's call, then starts the first of each prompt; the others start once it has a token.
  void Start() {
    const int n = request_.n;
    for (size_t p = 0; p < request_.prompts.size(); ++p) {
      for (int j = 0; j < n; ++j) {
        auto choice = std::make_unique<Choice>(this, static_cast<int>(choices_.size()), static_cast<int>(p));
        choice->call = std::make_shared<GenerateCall>(services_, choice.get());
        choices_.push_back(std::move(choice));
      }
    }
    remaining_ = static_cast<int>(choices_.size());
    *active_calls_ += remaining_;
    self_ = shared_from_this();  // the calls point at their emitters here until every choice is done
    exchange_->OnGone([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->CancelAll();
    });
    for (size_t p = 0; p < request_.prompts.size(); ++p) StartChoice(static_cast<int>(p) * n);
  }

 private:
  struct Choice final : GenerateCall::Emitter {
    Choice(ChoiceSet* set, int index, int prompt) : set(set), index(index), prompt(prompt) {}

    void Begin(const std::string&, const TextOptions& options) override {
      if (options.tool_calls) tools.emplace(*options.tool_calls, /*deltas=*/set->request_.stream);
      if (options.reasoning && set->request_.separate_reasoning) reasoning.emplace(*options.reasoning);
      set->Begun();
    }
    void Add(const RequestOutput& out, const std::string& text) override {
      if (!had_output && set->request_.echo) set->Echo(prompt, out, &pending);
      const bool last = out.finish != FinishReason::kNone;
      std::string answer = text;
      if (reasoning) {  // the reasoning first; the answer after it is where calls are looked for
        ReasoningPiece piece = reasoning->Feed(text);
        if (last) {
          ReasoningPiece rest = reasoning->Finish();
          piece.reasoning += rest.reasoning;
          piece.content += rest.content;
        }
        if (set->request_.include_reasoning) held_reasoning += piece.reasoning;
        answer = std::move(piece.content);
        if (set->request_.stream_reasoning || last) {
          pending.reasoning += held_reasoning;
          held_reasoning.clear();
        }
      }
      pending.text += tools ? tools->Feed(answer) : answer;
      if (tools && last) {  // what was held back: text, or the calls
        ToolCallSplit split = tools->Finish();
        pending.text += split.content;
        for (FoundToolCall& c : split.calls) {
          if (!pending.tool_calls.empty() && !set->request_.parallel_tool_calls) break;
          pending.tool_calls.push_back({NewToolCallId(), std::move(c.name), std::move(c.arguments)});
        }
      }
      if (tools) TakeCallPieces();
      pending.logprobs.insert(pending.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      if (out.finish != FinishReason::kNone) {
        pending.finish = out.finish;
        usage = out.usage;
      }
      has_pending = true;
      if (!had_output) {
        had_output = true;
        set->FirstOutput(prompt, index);
      }
    }
    // A stream's pieces of the calls, each call's first with a new id (the first call alone without
    // parallel_tool_calls).
    void TakeCallPieces() {
      for (ToolCallDelta& d : tools->TakeDeltas()) {
        if (d.index > 0 && !set->request_.parallel_tool_calls) continue;
        ToolCallChunk chunk{d.index, "", std::move(d.name), std::move(d.arguments)};
        if (call_ids.size() <= static_cast<size_t>(d.index)) call_ids.resize(d.index + 1);
        if (call_ids[d.index].empty()) chunk.id = call_ids[d.index] = NewToolCallId();
        pending.tool_call_deltas.push_back(std::move(chunk));
        called = true;
      }
      pending.called = called;
    }
    bool busy() const override { return writing; }
    bool Send(bool last) override {
      if (!set->request_.stream) {  // whole: kept until the end
        if (last) {
          whole.text += pending.text;
          whole.logprobs.insert(whole.logprobs.end(), pending.logprobs.begin(), pending.logprobs.end());
          whole.finish = pending.finish;
          whole.tool_calls = std::move(pending.tool_calls);
          whole.reasoning += pending.reasoning;
          pending = {};
        }
        return last;
      }
      if (writing || !has_pending) return false;
      pending.index = index;
      pending.first = !sent_any;
      std::string event = OpenAiChunkEvent(set->ctx_, pending);
      pending = {};
      has_pending = false;
      sent_any = true;
      writing = true;
      last_written = last;
      set->exchange_->Write(std::move(event), [call = std::weak_ptr<GenerateCall>(this->call)](bool ok) {
        if (auto c = call.lock()) c->SendDone(ok);
      });
      return false;
    }
    bool Sent() override {
      writing = false;
      return last_written;
    }
    void Finish(const absl::Status& status) override { set->ChoiceDone(index, status); }

    ChoiceSet* set;
    const int index;
    const int prompt;
    std::shared_ptr<GenerateCall> call;
    std::optional<ToolCallStream> tools;       // the request's tools: calls held back from the text (or streamed)
    std::vector<std::string> call_ids;         // a stream's calls' ids, by index
    bool called = false;                       // a stream's pieces of calls went out
    std::optional<ReasoningStream> reasoning;  // a thinking model's reasoning, split from the answer
    std::string held_reasoning;                // not yet sent (stream_reasoning: false holds it to the end)
    ChoicePiece pending;                       // since the last send
    ChoicePiece whole;                         // unary: everything sent
    Usage usage;
    bool has_pending = false;
    bool had_output = false;
    bool sent_any = false;
    bool writing = false;
    bool last_written = false;
  };

  // An error about the output constraint, under the name the request gave it (its compilation names the gRPC
  // field it travels in).
  absl::Status ApiNames(const absl::Status& status) const {
    const absl::string_view message = status.message();
    if (request_.constraint_field.empty() || !absl::StartsWith(message, "constraint")) return status;
    const size_t end = message.find_first_of(": ");
    return absl::Status(status.code(),
                        absl::StrCat(request_.constraint_field, message.substr(std::min(end, message.size()))));
  }

  void StartChoice(int index) {
    auto self = shared_from_this();
    const v1::GenerateRequest& proto = request_.prompts[choices_[index]->prompt];
    const int j = index % request_.n;
    choices_[index]->call->Start(
        [self, &proto, j](const std::shared_ptr<Engine>& engine) -> absl::StatusOr<BuiltRequest> {
          v1::GenerateRequest sibling;  // a seeded request's choices differ, and each is reproducible
          if (j > 0 && proto.sampling().has_seed()) {
            sibling = proto;
            sibling.mutable_sampling()->set_seed(proto.sampling().seed() + j);
          }
          auto built = PrepareGenerate(engine, sibling.has_sampling() ? sibling : proto, absl::InfiniteFuture());
          return built.ok() ? std::move(built) : self->ApiNames(built.status());
        });
  }

  // echo: before a choice's first output, its prompt's text and, with logprobs, its tokens' logprobs (the first
  // token has none: NaN, which the answer shows as null; a text prompt is tokenized again as the engine did).
  void Echo(int prompt, const RequestOutput& out, ChoicePiece* piece) const {
    const v1::GenerateRequest& p = request_.prompts[prompt];
    const Tokenizer* tokenizer = ctx_.tokenizer;
    std::vector<int32_t> ids(p.token_ids().ids().begin(), p.token_ids().ids().end());
    if (p.has_token_ids()) {
      piece->text += tokenizer ? tokenizer->Decode(ids, /*skip_special_tokens=*/false) : std::string();
    } else {
      piece->text += p.text();
      const bool add_special = !p.output().has_add_special_tokens() || p.output().add_special_tokens();
      if (tokenizer && ctx_.logprobs) ids = tokenizer->Encode(p.text(), add_special);
    }
    if (!ctx_.logprobs || ids.empty()) return;
    piece->logprobs.push_back({ids[0], std::numeric_limits<float>::quiet_NaN(), {}});
    piece->logprobs.insert(piece->logprobs.end(), out.prompt_logprobs.begin(), out.prompt_logprobs.end());
  }

  // The first choice of `prompt` has its first token (its KV blocks are cached) or ended: start its siblings.
  void FirstOutput(int prompt, int index) {
    if (index % request_.n != 0 || request_.n == 1) return;
    // Not from here: this runs under the first choice's lock, and a sibling refused at once would end under it.
    auto self = shared_from_this();
    if (!services_.writers->TryRun([self, prompt] { self->StartSiblings(prompt); })) StartSiblings(prompt);
  }
  void StartSiblings(int prompt) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (siblings_started_.empty()) siblings_started_.assign(request_.prompts.size(), false);
      if (siblings_started_[prompt]) return;
      siblings_started_[prompt] = true;
    }
    for (int j = 1; j < request_.n; ++j) StartChoice(prompt * request_.n + j);
  }

  void Begun() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!request_.stream || head_sent_) return;
    head_sent_ = true;
    exchange_->StartStream(200, "text/event-stream", IgnoredFieldsHeader(request_));
  }

  void ChoiceDone(int index, const absl::Status& status) {
    bool cancel_others = false, done = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status.ok() && error_.ok()) {
        error_ = status;
        cancel_others = true;
      }
      done = --remaining_ == 0;
    }
    const int prompt = choices_[index]->prompt;
    auto self = shared_from_this();
    // Posted: this runs under the ending call's lock, and the others' locks are taken next.
    auto later = [self, prompt, cancel_others, done] {
      if (cancel_others) self->CancelAll();
      self->StartSiblings(prompt);  // a first choice that ended without a token still lets its siblings end
      if (done) self->Answer();
    };
    if (!services_.writers->TryRun(later)) std::thread(later).detach();  // the writers are stopping
  }

  void CancelAll() {
    for (auto& c : choices_) c->call->Cancel();
  }

  // Every choice is done: the answer, then the calls let go of their emitters.
  void Answer() {
    absl::Status error;
    bool head_sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      error = error_;
      head_sent = head_sent_;
    }
    UsageTotals usage;
    for (auto& c : choices_) {
      if (c->index % request_.n == 0) {
        usage.prompt_tokens += c->usage.prompt_tokens;
        usage.cached_tokens += c->usage.cached_prompt_tokens;
      }
      usage.completion_tokens += c->usage.completion_tokens;
    }
    if (!request_.stream) {
      if (!error.ok()) {
        Fail(*exchange_, error);
      } else {
        std::vector<ChoicePiece> pieces;
        for (auto& c : choices_) {
          c->whole.index = c->index;
          pieces.push_back(std::move(c->whole));
        }
        exchange_->Respond(200, kJson, OpenAiResponse(ctx_, pieces, usage), IgnoredFieldsHeader(request_));
      }
    } else if (!head_sent) {
      Fail(*exchange_, error.ok() ? absl::InternalError("no choice began") : error);
    } else {
      if (!error.ok()) {
        if (error.code() != absl::StatusCode::kCancelled) exchange_->Write(OpenAiErrorEvent(error), nullptr);
      } else if (request_.include_usage) {
        exchange_->Write(OpenAiUsageEvent(ctx_, usage), nullptr);
      }
      exchange_->Write(kOpenAiDoneEvent, nullptr);
      exchange_->End();
    }
    for (auto& c : choices_) c->call->Detach();
    *active_calls_ -= static_cast<int64_t>(choices_.size());
    self_.reset();
  }

  const std::shared_ptr<HttpExchange> exchange_;
  const OpenAiRequest request_;
  const OpenAiResponseContext ctx_;
  const GenerateCall::Services services_;
  const std::shared_ptr<std::atomic<int64_t>> active_calls_;
  std::vector<std::unique_ptr<Choice>> choices_;  // made in Start, never changed after
  std::mutex mu_;
  int remaining_ = 0;
  absl::Status error_;  // the first choice's failure
  bool head_sent_ = false;
  std::vector<bool> siblings_started_;
  std::shared_ptr<ChoiceSet> self_;  // from Start to Answer
};

// Content-Type: application/json, with at most a charset parameter of utf-8.
bool IsJsonContentType(const std::map<std::string, std::string>& headers) {
  const auto it = headers.find("content-type");
  if (it == headers.end()) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(absl::string_view(it->second), ';');
  if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(parts[0]), "application/json")) return false;
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::string_view param = absl::StripAsciiWhitespace(parts[i]);
    if (param.empty()) continue;
    const size_t eq = param.find('=');
    if (eq == absl::string_view::npos ||
        !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(param.substr(0, eq)), "charset")) {
      return false;
    }
    absl::string_view value = absl::StripAsciiWhitespace(param.substr(eq + 1));
    absl::ConsumePrefix(&value, "\"");
    absl::ConsumeSuffix(&value, "\"");
    if (!absl::EqualsIgnoreCase(value, "utf-8")) return false;
  }
  return true;
}

// The path without its query.
std::string Path(const std::string& target) {
  return target.substr(0, target.find('?'));
}

}  // namespace

void OpenAiFrontEnd::Handle(std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& req = exchange->request();
  const std::string path = Path(req.target);
  const bool health = path == "/health", metrics = path == "/metrics";
  if (hooks_.keys && !(health && hooks_.keys_exempt_health) && !(metrics && hooks_.keys_exempt_metrics)) {
    const auto it = req.headers.find("authorization");
    const auto key = it == req.headers.end() ? std::nullopt : BearerToken(it->second);
    if (!key || !hooks_.keys->Check(*key)) {
      if (hooks_.metrics) hooks_.metrics->CountAuthFailure("http");
      const absl::Status st = absl::UnauthenticatedError(
          key ? "the API key is not valid" : "an API key is required: send the header 'Authorization: Bearer KEY'");
      return exchange->Respond(401, kJson, OpenAiErrorBody(st), {{"WWW-Authenticate", "Bearer"}});
    }
  }
  // GET routes answer HEAD too (the same head, no body: the HTTP server leaves it out).
  const auto method_is = [&](const char* method) {
    const bool get = std::string_view(method) == "GET";
    if (req.method == method || (get && req.method == "HEAD")) return true;
    const std::string allowed = get ? "GET, HEAD" : method;
    exchange->Respond(405, kJson,
                      OpenAiErrorBody(absl::InvalidArgumentError(absl::StrCat(Preview(std::string_view(req.method), 16),
                                                                              " ", Preview(std::string_view(path)),
                                                                              " is not allowed; allowed: ", allowed)),
                                      405),
                      {{"Allow", allowed}});
    return false;
  };
  // POST with a JSON body. Only JSON: a form or plain-text body is what a web page can send to a loopback server
  // without a preflight.
  const auto json_post = [&] {
    if (!method_is("POST")) return false;
    if (IsJsonContentType(req.headers)) return true;
    exchange->Respond(415, kJson,
                      OpenAiErrorBody(absl::InvalidArgumentError("the request body's Content-Type is not allowed; "
                                                                 "allowed: application/json (charset utf-8)"),
                                      415));
    return false;
  };
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    if (json_post()) Generate(std::move(exchange), path == "/v1/chat/completions");
  } else if (path == "/v1/models") {
    if (method_is("GET")) Models(*exchange);
  } else if (path == "/get_load" || path == "/v1/loads" || path == "/server_info" || path == "/get_server_info" ||
             path == "/model_info" || path == "/get_model_info") {
    if (method_is("GET")) RouterRoute(std::move(exchange), path);
  } else if (path == "/tokenize" || path == "/detokenize" || path == "/v1/chat/completions/render" ||
             path == "/v1/completions/render") {
    if (json_post()) RouterRoute(std::move(exchange), path);
  } else if (health) {
    if (!method_is("GET")) return;
    if (hooks_.serving()) return exchange->Respond(200, kJson, "{}");
    Fail(*exchange, absl::UnavailableError("not serving: the model is loading, or the server is draining"));
  } else if (metrics && hooks_.metrics) {
    if (method_is("GET")) exchange->Respond(200, Metrics::kContentType, hooks_.metrics->Render());
  } else {
    Fail(*exchange, absl::NotFoundError(absl::StrCat("no route ", Preview(std::string_view(path)),
                                                     "; inferd serves /v1/chat/completions, "
                                                     "/v1/completions, /v1/models, /health and /metrics")));
  }
}

void OpenAiFrontEnd::Models(HttpExchange& exchange) {
  const GenerateCall::Services s = hooks_.services();
  if (!s.engine) return Fail(exchange, ModelLoadingStatus());
  const nlohmann::json body = {{"object", "list"},
                               {"data",
                                {{{"id", s.engine->model().name},
                                  {"object", "model"},
                                  {"created", started_},
                                  {"owned_by", "inferd"},
                                  {"max_model_len", s.engine->max_model_len()},
                                  {"vocab_size", s.engine->model().config.vocab_size}}}}};
  exchange.Respond(200, kJson, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void OpenAiFrontEnd::Generate(std::shared_ptr<HttpExchange> exchange, bool chat) {
  GenerateCall::Services s = hooks_.services();
  RequestWorkers* workers = s.workers;
  // The body is parsed on a request worker, not on the HTTP threads.
  auto job = [exchange, chat, s = std::move(s), active = hooks_.active_calls,
              refuse_unknown = hooks_.refuse_unknown_fields]() mutable {
    auto request = ParseOpenAiRequest(exchange->request().body, chat ? OpenAiRoute::kChat : OpenAiRoute::kCompletion,
                                      refuse_unknown);
    if (!request.ok()) return Fail(*exchange, request.status());
    if (!request->ignored_fields.empty()) {
      LogIgnoredFields(*request);
      if (s.metrics) s.metrics->CountIgnoredFields(static_cast<int64_t>(request->ignored_fields.size()));
    }
    if (!s.engine) return Fail(*exchange, ModelLoadingStatus());
    const std::string& served = s.engine->model().name;
    if (!request->model.empty() && request->model != served) {
      return Fail(*exchange, absl::NotFoundError(absl::StrCat("model = ", Preview(std::string_view(request->model)),
                                                              " is not served here; allowed: '", served, "'")));
    }
    OpenAiResponseContext ctx{.route = request->route,
                              .id = NewId(chat ? "chatcmpl" : "cmpl"),
                              .created = static_cast<int64_t>(std::time(nullptr)),
                              .model = served,
                              .logprobs = request->logprobs,
                              .top_logprobs = request->top_logprobs,
                              .tokenizer = s.engine->model().tokenizer.get()};
    std::make_shared<ChoiceSet>(exchange, *std::move(request), std::move(ctx), std::move(s), active)->Start();
  };
  if (!workers->TryRun(std::move(job))) Fail(*exchange, WorkersFullStatus());
}

}  // namespace inferd

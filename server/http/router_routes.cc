// The routes the scale-out routers call on a replica (vLLM's vllm-router, SGLang's sglang-router and their
// cache-aware policies): a request's prompt tokens exactly as the engine would take them (chat template applied),
// tokenising and detokenising, the replica's load, and what it serves.
//   POST /v1/chat/completions/render, /v1/completions/render   {"token_ids": [...]} (a list of them for several
//                                                                completions prompts)
//   POST /tokenize, /detokenize                                 vLLM's shapes
//   GET /get_load, /v1/loads                                    SGLang's per-rank list
//   GET /server_info, /get_server_info, /model_info, /get_model_info
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "server/http/bounded_json.h"
#include "server/http/openai_front_end.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"
#include "server/version.h"

namespace inferd {
namespace {

using json = nlohmann::json;
constexpr const char* kJson = "application/json";

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void Fail(HttpExchange& exchange, const absl::Status& status) {
  exchange.Respond(OpenAiHttpStatus(status), kJson, OpenAiErrorBody(status));
}

absl::Status Loading() {
  return absl::UnavailableError("the model is loading; retry when /health answers 200");
}

// The prompt tokens the engine would run for each of the request's prompts.
absl::StatusOr<std::vector<std::vector<int32_t>>> RenderTokens(const std::shared_ptr<Engine>& engine,
                                                               const OpenAiRequest& request) {
  std::vector<std::vector<int32_t>> out;
  for (const v1::GenerateRequest& p : request.prompts) {
    auto built = PrepareGenerate(engine, p, absl::InfiniteFuture());
    if (!built.ok()) return built.status();
    out.push_back(std::move(built->request.prompt));
  }
  return out;
}

}  // namespace

void OpenAiFrontEnd::RouterRoute(std::shared_ptr<HttpExchange> exchange, const std::string& path) {
  GenerateCall::Services s = hooks_.services();
  if (path == "/get_load" || path == "/v1/loads") {
    if (!s.engine) return Fail(*exchange, Loading());
    const EngineStats st = s.engine->Stats();
    const int64_t total_tokens = int64_t{st.total_blocks} * s.engine->block_size();
    const int64_t used_tokens = int64_t{st.total_blocks - st.free_blocks} * s.engine->block_size();
    if (path == "/get_load") {  // SGLang's older per-rank list
      return exchange->Respond(200, kJson,
                               Dump(json::array({{{"dp_rank", 0},
                                                  {"num_reqs", st.running + st.waiting},
                                                  {"num_waiting_reqs", st.waiting},
                                                  {"num_tokens", used_tokens}}})));
    }
    const json load = {
        {"dp_rank", 0},
        {"num_running_reqs", st.running},
        {"num_waiting_reqs", st.waiting},
        {"num_total_reqs", st.running + st.waiting},
        {"num_used_tokens", used_tokens},
        {"max_total_num_tokens", total_tokens},
        {"max_running_requests", s.engine->config().scheduler.max_num_seqs},
        {"token_usage", total_tokens > 0 ? double(used_tokens) / total_tokens : 0.0},
        {"cache_hit_rate", st.prefix_query_tokens > 0 ? double(st.prefix_hit_tokens) / st.prefix_query_tokens : 0.0}};
    return exchange->Respond(200, kJson,
                             Dump({{"version", kVersion}, {"dp_rank_count", 1}, {"loads", json::array({load})}}));
  }
  if (path == "/server_info" || path == "/get_server_info" || path == "/model_info" || path == "/get_model_info") {
    if (!s.engine) return Fail(*exchange, Loading());
    const Config& c = s.engine->config();
    const Model& m = s.engine->model();
    json body;
    if (path.find("model_info") != std::string::npos) {
      body = {{"model_path", c.model.path},
              {"tokenizer_path", c.model.path},
              {"served_model_name", m.name},
              {"is_generation", true},
              {"architectures", json::array({m.config.architecture})}};
    } else {
      body = {{"model_path", c.model.path},
              {"served_model_name", m.name},
              {"version", kVersion},
              {"dp_size", 1},
              {"max_running_requests", c.scheduler.max_num_seqs},
              {"max_prefill_tokens", c.scheduler.max_num_batched_tokens},
              {"max_total_tokens", int64_t{s.engine->Stats().total_blocks} * s.engine->block_size()},
              {"context_length", s.engine->max_model_len()},
              {"page_size", s.engine->block_size()},
              {"kv_events", nullptr}};
    }
    return exchange->Respond(200, kJson, Dump(body));
  }
  // The rest read a body and tokenise: on a request worker, as generate requests are.
  auto job = [exchange, path, engine = s.engine, refuse_unknown = hooks_.refuse_unknown_fields] {
    if (!engine) return Fail(*exchange, Loading());
    const std::string& body = exchange->request().body;
    const Tokenizer& tokenizer = *engine->model().tokenizer;
    if (path == "/detokenize") {
      absl::StatusOr<json> j = ParseBoundedJson(body, "the request body");
      if (!j.ok()) return Fail(*exchange, j.status());
      const json tokens = j->is_object() ? j->value("tokens", json()) : json();
      if (!tokens.is_array()) return Fail(*exchange, absl::InvalidArgumentError("tokens: a list of token ids"));
      std::vector<int32_t> ids;
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (!tokens[i].is_number_integer() || tokens[i].get<int64_t>() < 0 ||
            tokens[i].get<int64_t>() >= tokenizer.vocab_size()) {
          return Fail(*exchange,
                      absl::InvalidArgumentError(absl::StrCat("tokens[", i, "] is not allowed; allowed: ids in [0, ",
                                                              tokenizer.vocab_size(), ")")));
        }
        ids.push_back(tokens[i].get<int32_t>());
      }
      return exchange->Respond(200, kJson, Dump({{"prompt", tokenizer.Decode(ids, /*skip_special_tokens=*/false)}}));
    }
    // Render, or tokenize (a chat's messages, or a prompt): the generate request's own parser and builder.
    const bool tokenize = path == "/tokenize";
    bool chat = path == "/v1/chat/completions/render";
    std::string generate_body = body;
    if (tokenize) {
      absl::StatusOr<json> j = ParseBoundedJson(body, "the request body");
      if (!j.ok()) return Fail(*exchange, j.status());
      if (!j->is_object()) return Fail(*exchange, absl::InvalidArgumentError("the request body: one JSON object"));
      chat = j->contains("messages");
      j->erase("return_token_strs");  // tokens are returned without their text pieces
      generate_body = Dump(*j);
    }
    auto request =
        ParseOpenAiRequest(generate_body, chat ? OpenAiRoute::kChat : OpenAiRoute::kCompletion, refuse_unknown);
    if (!request.ok()) return Fail(*exchange, request.status());
    auto tokens = RenderTokens(engine, *request);
    if (!tokens.ok()) return Fail(*exchange, tokens.status());
    if (tokenize) {
      const std::vector<int32_t>& ids = tokens->front();
      return exchange->Respond(200, kJson,
                               Dump({{"count", ids.size()},
                                     {"max_model_len", engine->max_model_len()},
                                     {"tokens", ids},
                                     {"token_strs", nullptr}}));
    }
    if (tokens->size() == 1) return exchange->Respond(200, kJson, Dump({{"token_ids", tokens->front()}}));
    json list = json::array();
    for (const auto& ids : *tokens) list.push_back({{"token_ids", ids}});
    exchange->Respond(200, kJson, Dump(list));
  };
  if (!s.workers->TryRun(job)) {
    Fail(*exchange, absl::ResourceExhaustedError("the request workers' queue is full; retry later"));
  }
}

}  // namespace inferd

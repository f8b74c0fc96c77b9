// The OpenAI-compatible HTTP routes over the same request path as gRPC (server/generate_call.h):
//   POST /v1/chat/completions, POST /v1/completions   (unary JSON, or Server-Sent Events with "stream": true)
//   GET /v1/models, GET /health (200 only while SERVING), GET /metrics
//   and the routes the scale-out routers call (server/http/router_routes.cc)
// A request's prompts × n choices are one GenerateCall each; the choices after a prompt's first start once its
// first token is out, so they find the prompt's KV blocks in the prefix cache. A client that goes away cancels
// every choice at once.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "server/api_keys.h"
#include "server/generate_call.h"
#include "server/http/http_server.h"
#include "server/metrics.h"

namespace inferd {

class OpenAiFrontEnd {
 public:
  struct Hooks {
    std::function<GenerateCall::Services()> services;    // the engine (null while loading), workers, metrics
    std::shared_ptr<std::atomic<int64_t>> active_calls;  // generate calls not yet done (the drain waits for them)
    std::function<bool()> serving;                       // what grpc.health.v1 says now
    Metrics* metrics = nullptr;                          // /metrics; null: 404
    const ApiKeys* keys = nullptr;                       // null: no keys asked
    bool keys_exempt_health = true;                      // /health without a key
    bool keys_exempt_metrics = true;                     // /metrics without a key
    bool refuse_unknown_fields = false;                  // server.http_unknown_fields: refuse
  };
  explicit OpenAiFrontEnd(Hooks hooks) : hooks_(std::move(hooks)) {}

  void Handle(std::shared_ptr<HttpExchange> exchange);

 private:
  void Generate(std::shared_ptr<HttpExchange> exchange, bool chat);
  // What the scale-out routers ask a replica (server/http/router_routes.cc).
  void RouterRoute(std::shared_ptr<HttpExchange> exchange, const std::string& path);
  void Models(HttpExchange& exchange);

  const Hooks hooks_;
  const int64_t started_ = static_cast<int64_t>(std::time(nullptr));
};

}  // namespace inferd

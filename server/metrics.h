// Prometheus metrics on server.metrics_listen (path /metrics), through prometheus-cpp (metrics and their text
// format) served by inferd's HTTP server: requests by finish
// reason and by gRPC status, latency and length histograms, per-step batch sizes, and the engine's state
// (running and waiting requests, KV blocks, prefix cache, preemptions) read at each scrape.
#pragma once

#include <grpcpp/support/status.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace inferd {

class Metrics {
 public:
  // Serves /metrics on `listen` (HOST:PORT; empty: nowhere of its own, the HTTP front end serves Render());
  // fails naming server.metrics_listen when it cannot.
  // Slow clients there are closed after request_timeout_s (server.http_request_timeout_s), and at most
  // kMaxMetricsConnections are open at once.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen, double request_timeout_s = 30);
  static constexpr int64_t kMaxMetricsConnections = 64;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";
  ~Metrics();

  // Installs the engine's observers and reads its state at every scrape. Before the engine serves.
  void Attach(std::shared_ptr<Engine> engine);
  // A Generate or GenerateStream call ended with this status (refused ones included).
  void CountCall(grpc::StatusCode code);
  // A request refused for its API key ("grpc" or "http").
  void CountAuthFailure(const char* front_end);
  // An HTTP request carried `fields` fields inferd does not know and ignored (server.http_unknown_fields).
  void CountIgnoredFields(int64_t fields);
  // The exposition text of every metric, read now.
  std::string Render() const;

  struct Impl;

 private:
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd

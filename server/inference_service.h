// The gRPC Inference service (callback API). Reactors never block: a generate call (server/generate_call.h) hands
// its request to the engine and writes its outputs as they arrive; protobuf conversion is server/proto_conversion.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>

#include "engine/engine.h"
#include "inferd/v1/inferd.grpc.pb.h"
#include "server/api_keys.h"
#include "server/generate_call.h"
#include "server/metrics.h"
#include "server/request_workers.h"

namespace inferd {

// Metadata of one call: gRPC's transport takes up to kTransportMetadataBytes (more and gRPC 1.51 closes the whole
// connection, every call on it with it), and the service refuses a call of more than kMaxCallMetadataBytes with
// RESOURCE_EXHAUSTED, so only that call fails.
constexpr int kTransportMetadataBytes = 1 << 20;
constexpr size_t kMaxCallMetadataBytes = 16 << 10;

// Every method takes raw bytes so that a request the protobuf parser refuses (malformed, invalid UTF-8 in a
// string field) is answered INVALID_ARGUMENT naming the message rather than a transport error.
using InferenceServiceBase =
    v1::Inference::WithRawCallbackMethod_GenerateStream<v1::Inference::WithRawCallbackMethod_Generate<
        v1::Inference::WithRawCallbackMethod_Tokenize<v1::Inference::WithRawCallbackMethod_Detokenize<
            v1::Inference::WithRawCallbackMethod_GetModelInfo<v1::Inference::WithRawCallbackMethod_GetServerInfo<
                v1::Inference::WithRawCallbackMethod_Abort<v1::Inference::CallbackService>>>>>>>;

class InferenceService final : public InferenceServiceBase {
 public:
  struct Limits {
    int64_t max_request_bytes = 4 << 20;  // server.max_request_bytes
    int32_t max_queue = 256;              // scheduler.max_queue
  };
  // Parsing, chat rendering and tokenizing run on `request_workers` threads; as many requests may wait for them as
  // the scheduler would take waiting (scheduler.max_queue), and at least 64 per thread.
  // Building and writing the outputs the engine hands over run on kOutputWriters threads, never on the engine's:
  // its GPU would otherwise wait for them every step (through gRPC at 256 streams, 2.8 ms of a 17.7 ms step).
  InferenceService(Limits limits, int request_workers)
      : limits_(limits),
        workers_(request_workers, std::max(64 * request_workers, limits.max_queue)),
        writers_(kOutputWriters, std::numeric_limits<int>::max()) {}

  // Generate calls are counted by status there, when set (before serving).
  void SetMetrics(Metrics* metrics) { metrics_ = metrics; }
  // Every method then needs one of these keys in its `authorization: Bearer KEY` metadata (before serving).
  void SetApiKeys(const ApiKeys* keys) { keys_ = keys; }
  // Until an engine is set (model loading), generation RPCs answer UNAVAILABLE.
  void SetEngine(std::shared_ptr<Engine> engine) {
    std::lock_guard<std::mutex> lock(mu_);
    engine_ = std::move(engine);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* result) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  // Generate and GenerateStream calls not yet done (their last write may still be going out).
  int64_t active_generate_calls() const { return active_calls_->load(); }

  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

  // What a generate call runs on, for every front end; and the count of their calls not yet done.
  GenerateCall::Services Services() { return {engine(), &workers_, &writers_, metrics_}; }
  std::shared_ptr<std::atomic<int64_t>> call_counter() const { return active_calls_; }

 private:
  // Reactors keep their own reference, so the engine outlives every call that uses it.
  std::shared_ptr<Engine> engine() const {
    std::lock_guard<std::mutex> lock(mu_);
    return engine_;
  }
  // The call's metadata within kMaxCallMetadataBytes, then its API key (when keys are asked).
  absl::Status Authorize(grpc::CallbackServerContext* ctx);
  const ApiKeys* keys_ = nullptr;
  mutable std::mutex mu_;
  std::shared_ptr<Engine> engine_;
  const Limits limits_;
  Metrics* metrics_ = nullptr;
  std::shared_ptr<std::atomic<int64_t>> active_calls_ = std::make_shared<std::atomic<int64_t>>(0);
  RequestWorkers workers_;
  // Each live call queues at most one job here at a time.
  static constexpr int kOutputWriters = 2;
  RequestWorkers writers_;
};

}  // namespace inferd

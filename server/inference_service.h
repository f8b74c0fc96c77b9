// The gRPC Inference service (callback API). Reactors never block: they hand requests to the engine and
// write its outputs one at a time as they arrive.
#pragma once

#include <atomic>

#include "engine/engine.h"
#include "inferd/v1/inferd.grpc.pb.h"

namespace inferd {

class InferenceService final : public v1::Inference::CallbackService {
 public:
  // Until an engine is set (model loading), generation RPCs answer UNAVAILABLE.
  void SetEngine(Engine* engine) { engine_.store(engine); }

  grpc::ServerWriteReactor<v1::GenerateChunk>* GenerateStream(grpc::CallbackServerContext* ctx,
                                                              const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request,
                                     v1::GenerateResult* result) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;

 private:
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace inferd

#include "server/inference_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/generate_call.h"
#include "server/proto_conversion.h"
#include "server/status_mapping.h"
#include "server/version.h"

namespace inferd {
namespace {

// A Generate or GenerateStream request from its bytes: bounded, parsed, then prepared as every front end's.
GenerateCall::Prepare FromWire(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire, int64_t max_bytes) {
  return [ctx, wire, max_bytes](const std::shared_ptr<Engine>& engine) -> absl::StatusOr<BuiltRequest> {
    if (!engine) return ModelLoadingStatus();
    if (static_cast<int64_t>(wire->Length()) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("GenerateRequest = ", wire->Length(),
                                                     " bytes is not allowed; allowed: at most "
                                                     "server.max_request_bytes = ",
                                                     max_bytes));
    }
    v1::GenerateRequest proto;
    if (absl::Status st = ParseMessage(*wire, "GenerateRequest", &proto); !st.ok()) return st;
    const auto deadline = ctx->deadline();
    return PrepareGenerate(
        engine, proto,
        deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture() : absl::FromChrono(deadline));
  };
}

// GenerateStream's emitter: one chunk written at a time; what arrives while a write is out merges into the next.
class StreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public GenerateCall::Emitter {
 public:
  StreamReactor(GenerateCall::Services services, GenerateCall::Prepare prepare,
                std::shared_ptr<std::atomic<int64_t>> active_calls)
      : call_(std::make_shared<GenerateCall>(std::move(services), this)), active_calls_(std::move(active_calls)) {
    ++*active_calls_;
    call_->Start(std::move(prepare));
  }

  void Begin(const std::string& request_id, const TextOptions& text) override {
    id_ = request_id;
    if (text.tool_calls) tools_.emplace(*text.tool_calls);
  }
  void Add(const RequestOutput& out, const std::string& text) override {
    if (!chunk_ready_) {
      chunk_.Clear();
      chunk_.set_request_id(id_);
      chunk_ready_ = true;
    }
    AppendOutput(out, text, &chunk_);
    if (tools_) tools_->Add(text, out.finish != FinishReason::kNone, chunk_.mutable_tool_calls());
  }
  bool busy() const override { return writing_; }
  bool Send(bool last) override {
    if (writing_ || !chunk_ready_) return false;
    writing_ = true;
    chunk_ready_ = false;
    last_written_ = last;
    Serialize(chunk_, &wire_);
    StartWrite(&wire_);
    return false;  // complete once the last write is done
  }
  bool Sent() override {
    writing_ = false;
    return last_written_;
  }
  void Finish(const absl::Status& status) override {
    grpc::ServerWriteReactor<grpc::ByteBuffer>::Finish(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override { call_->SendDone(ok); }
  void OnCancel() override { call_->Cancel(); }
  void OnDone() override {
    call_->Detach();
    --*active_calls_;
    delete this;
  }

 private:
  std::shared_ptr<GenerateCall> call_;
  std::shared_ptr<std::atomic<int64_t>> active_calls_;
  std::string id_;
  std::optional<ToolCallText> tools_;
  v1::GenerateChunk chunk_;  // made, not yet written
  bool chunk_ready_ = false;
  bool writing_ = false;
  bool last_written_ = false;
  grpc::ByteBuffer wire_;  // the chunk being written; alive until OnWriteDone
};

// Generate's emitter: the whole result, answered once.
class UnaryGenerateReactor final : public grpc::ServerUnaryReactor, public GenerateCall::Emitter {
 public:
  UnaryGenerateReactor(GenerateCall::Services services, GenerateCall::Prepare prepare, grpc::ByteBuffer* wire,
                       std::shared_ptr<std::atomic<int64_t>> active_calls)
      : call_(std::make_shared<GenerateCall>(std::move(services), this)),
        active_calls_(std::move(active_calls)),
        wire_(wire) {
    ++*active_calls_;
    call_->Start(std::move(prepare));
  }

  void Begin(const std::string& request_id, const TextOptions& text) override {
    result_.set_request_id(request_id);
    if (text.tool_calls) tools_.emplace(*text.tool_calls);
  }
  void Add(const RequestOutput& out, const std::string& text) override {
    AppendOutput(out, text, &result_);
    if (tools_) tools_->Add(text, out.finish != FinishReason::kNone, result_.mutable_tool_calls());
  }
  bool busy() const override { return false; }
  bool Send(bool last) override {
    if (last) Serialize(result_, wire_);
    return last;
  }
  bool Sent() override { return false; }
  void Finish(const absl::Status& status) override { grpc::ServerUnaryReactor::Finish(ToGrpcStatus(status)); }

  void OnCancel() override { call_->Cancel(); }
  void OnDone() override {
    call_->Detach();
    --*active_calls_;
    delete this;
  }

 private:
  std::shared_ptr<GenerateCall> call_;
  std::shared_ptr<std::atomic<int64_t>> active_calls_;
  grpc::ByteBuffer* wire_;
  std::optional<ToolCallText> tools_;
  v1::GenerateResult result_;
};

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(status));
  return r;
}

// A stream refused before it starts.
class RefusedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::Status InferenceService::Authorize(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  size_t metadata_bytes = 0;
  for (const auto& [key, value] : md) metadata_bytes += key.size() + value.size();
  if (metadata_bytes > kMaxCallMetadataBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the call's metadata is ", metadata_bytes, " bytes; allowed: at most ", kMaxCallMetadataBytes));
  }
  if (!keys_) return absl::OkStatus();
  if (md.count("authorization") > 1) {  // which one a proxy before us checked is unknowable: refuse, as HTTP does
    if (metrics_) metrics_->CountAuthFailure("grpc");
    return absl::UnauthenticatedError("the metadata 'authorization' is sent more than once; allowed: once");
  }
  const auto it = md.find("authorization");
  const auto key = it == md.end() ? std::nullopt : BearerToken(std::string_view(it->second.data(), it->second.size()));
  if (key && keys_->Check(*key)) return absl::OkStatus();
  if (metrics_) metrics_->CountAuthFailure("grpc");
  return absl::UnauthenticatedError(key ? "the API key is not valid"
                                        : "an API key is required: send the metadata 'authorization: Bearer KEY'");
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::GenerateStream(grpc::CallbackServerContext* ctx,
                                                                             const grpc::ByteBuffer* request) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return new RefusedStream(st);
  return new StreamReactor(Services(), FromWire(ctx, request, limits_.max_request_bytes), active_calls_);
}

grpc::ServerUnaryReactor* InferenceService::Generate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* result) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return Answer(ctx, st);
  return new UnaryGenerateReactor(Services(), FromWire(ctx, request, limits_.max_request_bytes), result, active_calls_);
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                     grpc::ByteBuffer* out) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, ModelLoadingStatus());
  if (static_cast<int64_t>(wire->Length()) > limits_.max_request_bytes) {
    return Answer(ctx, absl::InvalidArgumentError(absl::StrCat("TokenizeRequest = ", wire->Length(),
                                                               " bytes is not allowed; allowed: at most "
                                                               "server.max_request_bytes = ",
                                                               limits_.max_request_bytes)));
  }
  auto request = std::make_shared<v1::TokenizeRequest>();
  if (absl::Status st = ParseMessage(*wire, "TokenizeRequest", request.get()); !st.ok()) return Answer(ctx, st);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const bool queued = workers_.TryRun([engine, reactor, request, out] {
    v1::TokenizeResponse response;
    const bool add_special = !request->has_add_special_tokens() || request->add_special_tokens();
    for (int32_t id : engine->model().tokenizer->Encode(request->text(), add_special)) response.add_token_ids(id);
    Serialize(response, out);
    reactor->Finish(grpc::Status::OK);
  });
  if (!queued) reactor->Finish(ToGrpcStatus(WorkersFullStatus()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::Detokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                       grpc::ByteBuffer* out) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, ModelLoadingStatus());
  v1::DetokenizeRequest request;
  if (absl::Status st = ParseMessage(*wire, "DetokenizeRequest", &request); !st.ok()) return Answer(ctx, st);
  const int32_t vocab = engine->model().tokenizer->vocab_size();
  std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Answer(ctx, absl::InvalidArgumentError(absl::StrCat("token_ids[", i, "] = ", ids[i],
                                                                 " is not allowed; allowed: [0, ", vocab, ")")));
    }
  }
  const bool skip = !request.has_skip_special_tokens() || request.skip_special_tokens();
  v1::DetokenizeResponse response;
  response.set_text(engine->model().tokenizer->Decode(ids, skip));
  Serialize(response, out);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                         grpc::ByteBuffer* out) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return Answer(ctx, st);
  v1::GetModelInfoRequest request;
  if (absl::Status st = ParseMessage(*wire, "GetModelInfoRequest", &request); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, ModelLoadingStatus());
  Serialize(ToModelInfo(*engine), out);
  return Answer(ctx, absl::OkStatus());
}
grpc::ServerUnaryReactor* InferenceService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* wire, grpc::ByteBuffer* out) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return Answer(ctx, st);
  v1::GetServerInfoRequest request;
  if (absl::Status st = ParseMessage(*wire, "GetServerInfoRequest", &request); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  Serialize(ToServerInfo(engine.get(), kVersion), out);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::Abort(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                  grpc::ByteBuffer* out) {
  if (absl::Status st = Authorize(ctx); !st.ok()) return Answer(ctx, st);
  v1::AbortRequest request;
  if (absl::Status st = ParseMessage(*wire, "AbortRequest", &request); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, ModelLoadingStatus());
  v1::AbortResponse response;
  response.set_found(engine->Abort(request.request_id()));
  Serialize(response, out);
  return Answer(ctx, absl::OkStatus());
}

}  // namespace inferd

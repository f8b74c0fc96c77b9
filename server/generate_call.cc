#include "server/generate_call.h"

#include <chrono>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/proto_conversion.h"
#include "server/request_builder.h"
#include "server/status_mapping.h"

namespace inferd {
namespace {

// An id no client can guess: 128 random bits.
std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("req-%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

// Parses, validates, renders and tokenizes a generate request.
absl::StatusOr<BuiltRequest> BuildFromWire(const std::shared_ptr<Engine>& engine, grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer& wire, int64_t max_request_bytes) {
  if (!engine) return ModelLoadingStatus();
  if (static_cast<int64_t>(wire.Length()) > max_request_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerateRequest = ", wire.Length(),
                     " bytes is not allowed; allowed: at most server.max_request_bytes = ", max_request_bytes));
  }
  const auto deadline = ctx->deadline();
  if (std::chrono::system_clock::now() >= deadline) {
    return absl::DeadlineExceededError("the request's deadline expired before it was tokenized");
  }
  v1::GenerateRequest proto;
  if (absl::Status st = ParseMessage(wire, "GenerateRequest", &proto); !st.ok()) return st;
  if (engine->draining()) return absl::UnavailableError("the server is draining and takes no new requests");
  const Model& m = engine->model();
  auto request =
      BuildRequest(proto, {m.tokenizer.get(), m.config.vocab_size, engine->max_model_len(), m.chat_template.get()});
  if (!request.ok()) return request.status();
  if (request->request.id.empty()) request->request.id = NewRequestId();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    request->request.deadline = absl::FromChrono(deadline);
  }
  return request;
}

}  // namespace

void GenerateCall::Start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  if (s_.workers->TryRun([self = shared_from_this(), ctx, request] { self->Prepare(ctx, *request); })) return;
  std::lock_guard<std::mutex> lock(mu_);
  EndLocked(ToGrpcStatus(WorkersFullStatus()));
}

void GenerateCall::Prepare(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& wire) {
  auto request = BuildFromWire(s_.engine, ctx, wire, s_.max_request_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return EndLocked(ToGrpcStatus(CallCancelledStatus("cancelled")));
  if (!request.ok()) return EndLocked(ToGrpcStatus(request.status()));
  if (emitter_) emitter_->Begin(request->request.id);
  request->request.sink = shared_from_this();
  text_.emplace(s_.engine->model().tokenizer.get(), std::move(request->text));
  auto handle = s_.engine->Submit(std::move(request->request));
  if (!handle.ok()) return EndLocked(ToGrpcStatus(handle.status()));
  submitted_ = true;
  handle_ = *handle;
}

void GenerateCall::Push(RequestOutput output) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!emitter_ || ended_) return;
  queue_.push_back(std::move(output));
  PostDrainLocked();
}

void GenerateCall::PostDrainLocked() {
  if (drain_posted_) return;
  drain_posted_ = s_.writers->TryRun([self = shared_from_this()] {
    std::lock_guard<std::mutex> lock(self->mu_);
    self->drain_posted_ = false;
    self->DrainLocked();
  });
  if (!drain_posted_) DrainLocked();  // the writers are stopping: drain from here
}

// Makes the text of the queued outputs and hands them to the emitter, also while a send is out (the stream then
// merges them into its next chunk), so a stop string reaches the engine at once; then sends what it can.
void GenerateCall::DrainLocked() {
  if (!emitter_ || ended_) return;
  while (!queue_.empty() && !last_added_ && error_.ok()) {
    RequestOutput out = std::move(queue_.front());
    queue_.pop_front();
    const std::string text = text_->Take(&out);
    if (!out.error.ok()) {
      error_ = out.error;
      break;
    }
    emitter_->Add(out, text);
    last_added_ = out.finish != FinishReason::kNone;
  }
  if (text_ && text_->stopped_at() && !stop_sent_) {
    stop_sent_ = true;  // the call ends when the engine confirms: its usage, its id free again
    s_.engine->StopAt(handle_, *text_->stopped_at());
  }
  if (emitter_->busy()) return;
  if (!error_.ok()) return EndLocked(ToGrpcStatus(error_));
  if (emitter_->Send(last_added_)) EndLocked(grpc::Status::OK);
}

void GenerateCall::SendDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!emitter_) return;
  const bool was_last = emitter_->Sent();
  if (!ok) {  // the client is gone; the engine is told by OnCancel
    queue_.clear();
    return EndLocked(ToGrpcStatus(CallCancelledStatus("the client went away")));
  }
  if (was_last) return EndLocked(grpc::Status::OK);
  // What was made while the send was out goes now; outputs still without text go to a writer (no text is made
  // on gRPC's threads).
  if (queue_.empty()) {
    DrainLocked();
  } else {
    PostDrainLocked();
  }
}

void GenerateCall::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (submitted_) s_.engine->Cancel(handle_);
}

void GenerateCall::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  emitter_ = nullptr;
}

void GenerateCall::EndLocked(const grpc::Status& status) {
  if (ended_ || !emitter_) return;
  ended_ = true;
  if (s_.metrics) s_.metrics->CountCall(status.error_code());
  emitter_->Finish(status);
}

}  // namespace inferd

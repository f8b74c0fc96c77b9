#include "server/generate_call.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/status_mapping.h"

namespace inferd {
namespace {

// An id no client can guess: 128 random bits.
std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("req-%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

}  // namespace

absl::StatusOr<BuiltRequest> PrepareGenerate(const std::shared_ptr<Engine>& engine, const v1::GenerateRequest& proto,
                                             absl::Time deadline) {
  if (!engine) return ModelLoadingStatus();
  if (absl::Now() >= deadline)
    return absl::DeadlineExceededError("the request's deadline expired before it was tokenized");
  if (engine->draining()) return absl::UnavailableError("the server is draining and takes no new requests");
  const Model& m = engine->model();
  auto request = BuildRequest(proto, {m.tokenizer.get(), m.config.vocab_size, engine->max_model_len(),
                                      m.chat_template.get(), &engine->constraint_compiler()});
  if (!request.ok()) return request.status();
  if (request->request.id.empty()) request->request.id = NewRequestId();
  if (deadline != absl::InfiniteFuture()) request->request.deadline = deadline;
  return request;
}

void GenerateCall::Start(Prepare prepare) {
  if (s_.workers->TryRun([self = shared_from_this(), prepare = std::move(prepare)] { self->Run(prepare); })) return;
  std::lock_guard<std::mutex> lock(mu_);
  EndLocked(WorkersFullStatus());
}

void GenerateCall::Run(const Prepare& prepare) {
  auto request = prepare(s_.engine);
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return EndLocked(CallCancelledStatus("cancelled"));
  if (!request.ok()) return EndLocked(request.status());
  if (emitter_) emitter_->Begin(request->request.id, request->text);
  request->request.sink = shared_from_this();
  text_.emplace(s_.engine->model().tokenizer.get(), std::move(request->text));
  auto handle = s_.engine->Submit(std::move(request->request));
  if (!handle.ok()) return EndLocked(handle.status());
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
  if (!error_.ok()) return EndLocked(error_);
  if (emitter_->Send(last_added_)) EndLocked(absl::OkStatus());
}

void GenerateCall::SendDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!emitter_) return;
  const bool was_last = emitter_->Sent();
  if (!ok) {  // the client is gone; the engine is told by OnCancel
    queue_.clear();
    return EndLocked(CallCancelledStatus("the client went away"));
  }
  if (was_last) return EndLocked(absl::OkStatus());
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

void GenerateCall::EndLocked(const absl::Status& status) {
  if (ended_ || !emitter_) return;
  ended_ = true;
  if (s_.metrics) s_.metrics->CountCall(static_cast<grpc::StatusCode>(status.code()));
  emitter_->Finish(status);
}

}  // namespace inferd

#include "server/inference_service.h"

#include <deque>
#include <mutex>
#include <optional>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"
#include "server/metrics.h"
#include "server/request_builder.h"
#include "server/status_mapping.h"
#include "server/text_output.h"

namespace inferd {
namespace {

constexpr const char* kVersion = "0.1.0";

absl::Status NotReady() {
  return absl::UnavailableError("the model is still loading");
}

// Parses a request from raw bytes, so that bytes protobuf refuses (malformed, or invalid UTF-8 in a string
// field) are INVALID_ARGUMENT naming the message rather than a transport error.
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, const char* name, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError(absl::StrCat(name, " could not be read"));
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " does not parse: a string field holds invalid UTF-8, or the message is malformed; allowed: a ", name,
        " with valid UTF-8 in every string field"));
  }
  return absl::OkStatus();
}

void Serialize(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  grpc::Slice slice(message.SerializeAsString());
  *out = grpc::ByteBuffer(&slice, 1);
}

template <typename Chunk>
void AppendOutput(const RequestOutput& out, const std::string& text, Chunk* chunk) {
  for (int32_t id : out.token_ids) chunk->add_token_ids(id);
  chunk->mutable_text()->append(text);
  for (const TokenLogprob& lp : out.logprobs) {
    v1::TokenLogprob* p = chunk->add_logprobs();
    p->set_token_id(lp.token_id);
    p->set_logprob(lp.logprob);
    for (const TopLogprob& t : lp.top) {
      v1::TopLogprob* tp = p->add_top();
      tp->set_token_id(t.token_id);
      tp->set_logprob(t.logprob);
    }
  }
  if (out.finish != FinishReason::kNone) {
    chunk->set_finish_reason(ToProto(out.finish));
    chunk->mutable_usage()->set_prompt_tokens(out.usage.prompt_tokens);
    chunk->mutable_usage()->set_completion_tokens(out.usage.completion_tokens);
    chunk->mutable_usage()->set_cached_prompt_tokens(out.usage.cached_prompt_tokens);
    chunk->mutable_timing()->set_queue_s(out.timing.queue_s);
    chunk->mutable_timing()->set_time_to_first_token_s(out.timing.time_to_first_token_s);
    chunk->mutable_timing()->set_total_s(out.timing.total_s);
  }
}

// An id no client can guess: 128 random bits.
std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("req-%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

// Parses, validates, renders and tokenizes a generate request (on a request worker, never a gRPC thread).
absl::StatusOr<BuiltRequest> Prepare(const std::shared_ptr<Engine>& engine, grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer& wire, int64_t max_request_bytes) {
  if (!engine) return NotReady();
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

grpc::Status Busy() {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "too many requests are being prepared (tokenized) at once; retry later");
}

// Streams a request's outputs: one write in flight at a time, the rest queued; ends with Finish.
class StreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  class Sink final : public OutputSink, public std::enable_shared_from_this<Sink> {
   public:
    Sink(StreamReactor* r, RequestWorkers* writers) : reactor_(r), writers_(writers) {}
    // On the engine thread: queues the output; its text, the chunk and the write are made on an output writer.
    void Push(RequestOutput output) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (!reactor_) return;
      queue_.push_back(std::move(output));
      PostDrainLocked();
    }
    // Text is made as outputs arrive, even while a write is in flight: a stop string reaches the engine at once.
    void PostDrainLocked() {
      if (drain_posted_) return;
      drain_posted_ = writers_->TryRun([self = shared_from_this()] { self->Drain(); });
      if (!drain_posted_) reactor_->DrainLocked(this);  // the writers are stopping: drain from here
    }
    void Drain() {
      std::lock_guard<std::mutex> lock(mu_);
      drain_posted_ = false;
      if (reactor_) reactor_->DrainLocked(this);
    }
    void Detach() {
      std::lock_guard<std::mutex> lock(mu_);
      reactor_ = nullptr;
    }

   private:
    friend class StreamReactor;
    std::mutex mu_;
    StreamReactor* reactor_;
    RequestWorkers* writers_;
    std::deque<RequestOutput> queue_;  // from the engine, text not yet made
    std::optional<TextOutput> text_;   // set with the request, before it is submitted
    bool stop_sent_ = false;           // the engine was told of the stop string
    v1::GenerateChunk chunk_;          // made, not yet written
    bool chunk_ready_ = false;         // chunk_ holds something to write
    bool chunk_last_ = false;          // chunk_ ends the stream
    absl::Status error_;               // the stream ends with it once the outputs before it are made
    bool writing_ = false;
    bool drain_posted_ = false;  // a Drain is queued on the writers
    bool finished_ = false;
    bool cancelled_ = false;  // OnCancel ran
    bool submitted_ = false;  // the engine has it, as handle_
    RequestHandle handle_ = 0;
  };

  StreamReactor(std::shared_ptr<Engine> engine, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* proto,
                const InferenceService::Limits& limits, RequestWorkers* workers, RequestWorkers* writers,
                std::shared_ptr<std::atomic<int64_t>> active_calls, Metrics* metrics)
      : engine_(std::move(engine)),
        sink_(std::make_shared<Sink>(this, writers)),
        active_calls_(std::move(active_calls)),
        metrics_(metrics) {
    ++*active_calls_;
    const int64_t max_bytes = limits.max_request_bytes;
    if (!workers->TryRun([this, ctx, proto, max_bytes] { Start(ctx, *proto, max_bytes); })) FinishOnce(Busy());
  }

  // On a request worker. The RPC stays open until this finishes it or submits it, so `this` is alive; once
  // the lock is released the reactor may be gone.
  void Start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& proto, int64_t max_bytes) {
    auto request = Prepare(engine_, ctx, proto, max_bytes);
    std::lock_guard<std::mutex> lock(sink_->mu_);
    if (sink_->cancelled_) return FinishOnceLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    if (!request.ok()) return FinishOnceLocked(ToGrpcStatus(request.status()));
    id_ = request->request.id;
    request->request.sink = sink_;
    sink_->text_.emplace(engine_->model().tokenizer.get(), std::move(request->text));
    auto handle = engine_->Submit(std::move(request->request));
    if (!handle.ok()) return FinishOnceLocked(ToGrpcStatus(handle.status()));
    sink_->submitted_ = true;
    sink_->handle_ = *handle;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(sink_->mu_);
    sink_->writing_ = false;
    if (!ok) {  // the client is gone; the engine is told by OnCancel
      sink_->queue_.clear();
      FinishOnceLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    if (last_written_) {
      FinishOnceLocked(grpc::Status::OK);
      return;
    }
    if (sink_->chunk_ready_ || !sink_->error_.ok()) sink_->PostDrainLocked();  // made while this write was out
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(sink_->mu_);
    sink_->cancelled_ = true;
    if (sink_->submitted_) engine_->Cancel(sink_->handle_);
  }

  void OnDone() override {
    sink_->Detach();
    --*active_calls_;
    delete this;
  }

 private:
  // On an output writer, with sink->mu_ held: makes the text of the outputs queued, merged into one chunk while
  // a write is out (fewer writes when the client reads slower than we step), then writes it unless one is out.
  void DrainLocked(Sink* sink) {
    if (sink->finished_) return;
    while (!sink->queue_.empty() && !sink->chunk_last_ && sink->error_.ok()) {
      RequestOutput out = std::move(sink->queue_.front());
      sink->queue_.pop_front();
      const std::string text = sink->text_->Take(&out);
      if (!out.error.ok()) {
        sink->error_ = out.error;
        break;
      }
      if (!sink->chunk_ready_) {
        sink->chunk_.Clear();
        sink->chunk_.set_request_id(id_);
        sink->chunk_ready_ = true;
      }
      AppendOutput(out, text, &sink->chunk_);
      sink->chunk_last_ = out.finish != FinishReason::kNone;
    }
    if (sink->text_->stopped_at() && !sink->stop_sent_) {
      sink->stop_sent_ = true;  // the stream ends when the engine confirms: its usage, its id free again
      engine_->StopAt(sink->handle_, *sink->text_->stopped_at());
    }
    if (sink->writing_) return;
    if (!sink->error_.ok()) {
      FinishOnceLocked(ToGrpcStatus(sink->error_));
      return;
    }
    if (!sink->chunk_ready_) return;
    sink->writing_ = true;
    sink->chunk_ready_ = false;
    last_written_ = sink->chunk_last_;
    Serialize(sink->chunk_, &wire_);
    StartWrite(&wire_);
  }

  void FinishOnce(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(sink_->mu_);
    FinishOnceLocked(status);
  }
  void FinishOnceLocked(const grpc::Status& status) {
    if (sink_->finished_) return;
    sink_->finished_ = true;
    if (metrics_) metrics_->CountCall(status.error_code());
    Finish(status);
  }

  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Sink> sink_;
  std::shared_ptr<std::atomic<int64_t>> active_calls_;
  Metrics* metrics_;
  std::string id_;
  bool last_written_ = false;
  grpc::ByteBuffer wire_;  // the chunk being written; alive until OnWriteDone
};

// Collects a request's outputs and answers once with the whole result.
class UnaryGenerateReactor final : public grpc::ServerUnaryReactor {
 public:
  class Sink final : public OutputSink, public std::enable_shared_from_this<Sink> {
   public:
    Sink(UnaryGenerateReactor* r, grpc::ByteBuffer* wire, RequestWorkers* writers)
        : reactor_(r), wire_(wire), writers_(writers) {}
    // On the engine thread: queues the output; the result is built on an output writer.
    void Push(RequestOutput output) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (!reactor_) return;
      queue_.push_back(std::move(output));
      if (drain_posted_) return;
      drain_posted_ = writers_->TryRun([self = shared_from_this()] { self->Drain(); });
      if (!drain_posted_) DrainLocked();  // the writers are stopping: build it from here
    }
    void Drain() {
      std::lock_guard<std::mutex> lock(mu_);
      drain_posted_ = false;
      DrainLocked();
    }
    void DrainLocked() {
      for (; reactor_ && !queue_.empty(); queue_.pop_front()) {
        RequestOutput& output = queue_.front();
        const std::string text = text_->Take(&output);
        AppendOutput(output, text, &result_);
        if (text_->stopped_at() && !stop_sent_) {
          stop_sent_ = true;  // the call ends when the engine confirms: its usage, its id free again
          reactor_->engine_->StopAt(handle_, *text_->stopped_at());
        }
        if (output.finish != FinishReason::kNone) {
          UnaryGenerateReactor* r = reactor_;
          reactor_ = nullptr;
          if (output.error.ok()) Serialize(result_, wire_);
          r->FinishCounted(ToGrpcStatus(output.error));
        }
      }
    }
    void Detach() {
      std::lock_guard<std::mutex> lock(mu_);
      reactor_ = nullptr;
    }

   private:
    friend class UnaryGenerateReactor;
    std::mutex mu_;
    UnaryGenerateReactor* reactor_;
    grpc::ByteBuffer* wire_;
    RequestWorkers* writers_;
    std::deque<RequestOutput> queue_;
    std::optional<TextOutput> text_;  // set with the request, before it is submitted
    bool stop_sent_ = false;          // the engine was told of the stop string
    bool drain_posted_ = false;       // a Drain is queued on the writers
    v1::GenerateResult result_;
    bool cancelled_ = false;  // OnCancel ran
    bool submitted_ = false;  // the engine has it, as handle_
    RequestHandle handle_ = 0;
  };

  UnaryGenerateReactor(std::shared_ptr<Engine> engine, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* proto,
                       grpc::ByteBuffer* result, const InferenceService::Limits& limits, RequestWorkers* workers,
                       RequestWorkers* writers, std::shared_ptr<std::atomic<int64_t>> active_calls, Metrics* metrics)
      : engine_(std::move(engine)),
        sink_(std::make_shared<Sink>(this, result, writers)),
        active_calls_(std::move(active_calls)),
        metrics_(metrics) {
    ++*active_calls_;
    const int64_t max_bytes = limits.max_request_bytes;
    if (!workers->TryRun([this, ctx, proto, max_bytes] { Start(ctx, *proto, max_bytes); })) {
      sink_->Detach();
      FinishCounted(Busy());
    }
  }

  // On a request worker; as StreamReactor::Start.
  void Start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& proto, int64_t max_bytes) {
    auto request = Prepare(engine_, ctx, proto, max_bytes);
    std::lock_guard<std::mutex> lock(sink_->mu_);
    auto fail = [&](const grpc::Status& status) {
      sink_->reactor_ = nullptr;
      FinishCounted(status);
    };
    if (sink_->cancelled_) return fail(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    if (!request.ok()) return fail(ToGrpcStatus(request.status()));
    sink_->result_.set_request_id(request->request.id);
    request->request.sink = sink_;
    sink_->text_.emplace(engine_->model().tokenizer.get(), std::move(request->text));
    auto handle = engine_->Submit(std::move(request->request));
    if (!handle.ok()) return fail(ToGrpcStatus(handle.status()));
    sink_->submitted_ = true;
    sink_->handle_ = *handle;
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(sink_->mu_);
    sink_->cancelled_ = true;
    if (sink_->submitted_) engine_->Cancel(sink_->handle_);
  }
  void OnDone() override {
    sink_->Detach();
    --*active_calls_;
    delete this;
  }
  void FinishCounted(const grpc::Status& status) {
    if (metrics_) metrics_->CountCall(status.error_code());
    Finish(status);
  }

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Sink> sink_;
  std::shared_ptr<std::atomic<int64_t>> active_calls_;
  Metrics* metrics_;
};

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(status));
  return r;
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::GenerateStream(grpc::CallbackServerContext* ctx,
                                                                             const grpc::ByteBuffer* request) {
  return new StreamReactor(engine(), ctx, request, limits_, &workers_, &writers_, active_calls_, metrics_);
}

grpc::ServerUnaryReactor* InferenceService::Generate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* result) {
  return new UnaryGenerateReactor(engine(), ctx, request, result, limits_, &workers_, &writers_, active_calls_,
                                  metrics_);
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                     grpc::ByteBuffer* out) {
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, NotReady());
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
  if (!queued) reactor->Finish(Busy());
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::Detokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                       grpc::ByteBuffer* out) {
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, NotReady());
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
  v1::GetModelInfoRequest request;
  if (absl::Status st = ParseMessage(*wire, "GetModelInfoRequest", &request); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, NotReady());
  const Model& m = engine->model();
  v1::ModelInfo info;
  info.set_name(m.name);
  info.set_architecture(m.config.architecture);
  info.set_vocab_size(m.config.vocab_size);
  info.set_max_model_len(engine->max_model_len());
  for (int32_t id : m.eos_token_ids) info.add_eos_token_ids(id);
  if (m.bos_token_id) info.set_bos_token_id(*m.bos_token_id);
  info.set_dtype(m.tensors.stored_dtype);
  info.set_block_size(engine->block_size());
  Serialize(info, out);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* wire, grpc::ByteBuffer* out) {
  v1::GetServerInfoRequest request;
  if (absl::Status st = ParseMessage(*wire, "GetServerInfoRequest", &request); !st.ok()) return Answer(ctx, st);
  v1::ServerInfo info;
  info.set_version(kVersion);
  if (const std::shared_ptr<Engine> engine = this->engine()) {
    const EngineStats s = engine->Stats();
    info.set_running_requests(s.running);
    info.set_waiting_requests(s.waiting);
    info.set_total_kv_blocks(s.total_blocks);
    info.set_free_kv_blocks(s.free_blocks);
    info.set_used_kv_blocks(s.total_blocks - s.free_blocks);
    info.set_cached_kv_blocks(s.cached_blocks);
    info.set_prefix_cache_hit_tokens(s.prefix_hit_tokens);
    info.set_prefix_cache_query_tokens(s.prefix_query_tokens);
    info.set_prefix_cache_hit_rate(s.prefix_query_tokens > 0 ? double(s.prefix_hit_tokens) / s.prefix_query_tokens
                                                             : 0.0);
    info.set_preemptions_total(s.preemptions);
    info.set_preempted_tokens_total(s.preempted_tokens);
    info.set_swapped_preemptions_total(s.swapped_preemptions);
    info.set_read_ceiling_bytes_per_s(engine->ceilings().read_bytes_per_s);
    info.set_gemm_ceiling_flops_per_s(engine->ceilings().gemm_flops_per_s);
    info.set_draining(engine->draining());
    info.set_backend(engine->backend_name());
    const MemoryPlan& p = engine->memory_plan();
    v1::MemoryPlan* mp = info.mutable_memory_plan();
    mp->set_device(p.device);
    mp->set_device_total_bytes(p.device_total_bytes);
    mp->set_device_free_bytes(p.device_free_bytes);
    mp->set_budget_bytes(p.budget_bytes);
    mp->set_weight_bytes(p.weight_bytes);
    mp->set_activation_bytes(p.activation_bytes);
    mp->set_other_bytes(p.other_bytes);
    mp->set_kv_bytes_per_block(p.kv_bytes_per_block);
    mp->set_num_blocks(p.num_blocks);
    mp->set_kv_bytes(p.kv_bytes());
  }
  Serialize(info, out);
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::Abort(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* wire,
                                                  grpc::ByteBuffer* out) {
  v1::AbortRequest request;
  if (absl::Status st = ParseMessage(*wire, "AbortRequest", &request); !st.ok()) return Answer(ctx, st);
  const std::shared_ptr<Engine> engine = this->engine();
  if (!engine) return Answer(ctx, NotReady());
  v1::AbortResponse response;
  response.set_found(engine->Abort(request.request_id()));
  Serialize(response, out);
  return Answer(ctx, absl::OkStatus());
}

}  // namespace inferd

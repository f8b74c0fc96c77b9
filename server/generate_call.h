// One Generate or GenerateStream call from its bytes to its end. The request is prepared (parsed, validated, its
// chat rendered, tokenized) on a request worker and submitted; the engine's outputs queue here and their text
// (server/text_output.h) is made on an output writer, never on the engine's thread, where a stop string found
// ends the request in the engine; a cancel reaches the engine; the call ends exactly once, counted by status.
// The two RPCs differ only in their Emitter: the stream writes chunks one at a time, merging what arrives while
// a write is out; the unary call answers once with the whole result.
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/request_workers.h"
#include "server/text_output.h"

namespace inferd {

class GenerateCall final : public OutputSink, public std::enable_shared_from_this<GenerateCall> {
 public:
  // The RPC's side; called with the call's lock held.
  class Emitter {
   public:
    virtual ~Emitter() = default;
    virtual void Begin(const std::string& request_id) = 0;
    // Adds one output and its text to what goes out next.
    virtual void Add(const RequestOutput& out, const std::string& text) = 0;
    // A send is out: outputs keep being added, and the call does not end, until SendDone.
    virtual bool busy() const = 0;
    // Sends what was added, if anything; `last`: the request's final output is among it. True when that
    // completes the answer (the call then ends OK).
    virtual bool Send(bool last) = 0;
    // The send that was out is done; true when it carried the final output.
    virtual bool Sent() = 0;
    virtual void Finish(const grpc::Status& status) = 0;
  };
  struct Services {
    std::shared_ptr<Engine> engine;  // null while the model loads
    RequestWorkers* workers;         // prepare requests
    RequestWorkers* writers;         // make text and write outputs
    int64_t max_request_bytes;
    Metrics* metrics;  // calls counted by status, when set
  };

  GenerateCall(Services services, Emitter* emitter) : s_(std::move(services)), emitter_(emitter) {}

  // Prepares and submits `request` on a request worker, or ends the call when their queue is full. ctx and
  // request belong to the RPC, which stays open until the call ends.
  void Start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request);
  // On the engine thread: queues the output for an output writer.
  void Push(RequestOutput output) override;
  void Cancel();           // the RPC's OnCancel
  void SendDone(bool ok);  // the emitter's send finished; !ok: the client is gone
  void Detach();           // the RPC's OnDone: nothing reaches it after this

 private:
  void Prepare(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& wire);
  void PostDrainLocked();
  void DrainLocked();
  void EndLocked(const grpc::Status& status);

  const Services s_;
  std::mutex mu_;
  Emitter* emitter_;                 // null once the RPC is done
  std::deque<RequestOutput> queue_;  // from the engine, text not yet made
  std::optional<TextOutput> text_;   // set with the request, before it is submitted
  absl::Status error_;               // the call ends with it once the outputs before it went out
  bool last_added_ = false;          // the request's final output was handed to the emitter
  bool stop_sent_ = false;           // the engine was told of the stop string
  bool drain_posted_ = false;        // a drain is queued on the writers
  bool ended_ = false;
  bool cancelled_ = false;  // OnCancel ran
  bool submitted_ = false;  // the engine has it, as handle_
  RequestHandle handle_ = 0;
};

}  // namespace inferd

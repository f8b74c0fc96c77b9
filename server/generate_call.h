// One generate request from its bytes to its end, whichever front end it came through (gRPC's Generate and
// GenerateStream, the OpenAI-compatible HTTP routes). The request is prepared (parsed, validated, its chat
// rendered, tokenized) on a request worker and submitted; the engine's outputs queue here and their text
// (server/text_output.h) is made on an output writer, never on the engine's thread, where a stop string found
// ends the request in the engine; a cancel reaches the engine; the call ends exactly once, counted by status.
// Front ends and their forms differ only in their Emitter: a stream writes chunks one at a time, merging what
// arrives while a write is out; a unary call answers once with the whole result.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "engine/engine.h"
#include "inferd/v1/inferd.pb.h"
#include "server/metrics.h"
#include "server/request_builder.h"
#include "server/request_workers.h"
#include "server/text_output.h"

namespace inferd {

class GenerateCall final : public OutputSink, public std::enable_shared_from_this<GenerateCall> {
 public:
  // The front end's side; called with the call's lock held.
  class Emitter {
   public:
    virtual ~Emitter() = default;
    // The request is made: its id and how its text is made.
    virtual void Begin(const std::string& request_id, const TextOptions& text) = 0;
    // Adds one output and its text to what goes out next.
    virtual void Add(const RequestOutput& out, const std::string& text) = 0;
    // A send is out: outputs keep being added, and the call does not end, until SendDone.
    virtual bool busy() const = 0;
    // Sends what was added, if anything; `last`: the request's final output is among it. True when that
    // completes the answer (the call then ends OK).
    virtual bool Send(bool last) = 0;
    // The send that was out is done; true when it carried the final output.
    virtual bool Sent() = 0;
    virtual void Finish(const absl::Status& status) = 0;
  };
  struct Services {
    std::shared_ptr<Engine> engine;  // null while the model loads
    RequestWorkers* workers;         // prepare requests
    RequestWorkers* writers;         // make text and write outputs
    Metrics* metrics;                // calls counted by status, when set
  };

  GenerateCall(Services services, Emitter* emitter) : s_(std::move(services)), emitter_(emitter) {}

  // Makes the engine request from the front end's bytes (PrepareGenerate does the shared part); runs on a
  // request worker with the call's engine (null while the model loads).
  using Prepare = std::function<absl::StatusOr<BuiltRequest>(const std::shared_ptr<Engine>& engine)>;
  // Prepares and submits the request on a request worker, or ends the call when their queue is full. What
  // `prepare` reads belongs to the front end's call, which stays open until this call ends.
  void Start(Prepare prepare);
  // On the engine thread: queues the output for an output writer.
  void Push(RequestOutput output) override;
  void Cancel();           // the client cancelled (gRPC's OnCancel, an HTTP client gone)
  void SendDone(bool ok);  // the emitter's send finished; !ok: the client is gone
  void Detach();           // the front end's call is done: nothing reaches its emitter after this

 private:
  void Run(const Prepare& prepare);
  void PostDrainLocked();
  void DrainLocked();
  void EndLocked(const absl::Status& status);

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

// What every front end shares in preparing a generate request: refused while draining, validated against the
// model (server/request_builder.h), given an id when it has none, and the front end's deadline (InfiniteFuture:
// none).
absl::StatusOr<BuiltRequest> PrepareGenerate(const std::shared_ptr<Engine>& engine, const v1::GenerateRequest& proto,
                                             absl::Time deadline);

}  // namespace inferd

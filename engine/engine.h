// The engine: one thread that owns the scheduler, the block pool and the backend and runs the step loop
// (schedule → step: forward and sample on the backend → update). Submit and Abort are thread-safe and return at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/grammar/output_constraint.h"
#include "engine/kv_cache/block_pool.h"
#include "engine/model/kv_groups.h"
#include "engine/model/model.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/step_cost.h"
#include "engine/scheduler/scheduler.h"
#include "engine/spec/draft_payoff.h"
#include "engine/spec/suffix_drafts.h"

namespace inferd {

// The engine's own identity of a submitted request: unique for the engine's life, never reused (unlike ids,
// which a client may use again once a request finished).
using RequestHandle = uint64_t;

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t unfinished = 0;  // accepted and not yet finished, wherever they are (queued, scheduled, mid-step)
  int32_t total_blocks = 0;
  int32_t free_blocks = 0;             // held by no request (cached ones included)
  int32_t cached_blocks = 0;           // free blocks that still hold a reusable prefix
  int64_t preemptions = 0;             // requests sent back to waiting to free blocks or a slot
  int64_t preempted_tokens = 0;        // computed tokens those preemptions threw away
  int64_t swapped_preemptions = 0;     // preemptions that kept the KV in host swap space instead
  int64_t prefix_query_tokens = 0;     // prompt tokens looked up in the prefix cache at first admission
  int64_t prefix_hit_tokens = 0;       // of those, found cached (either tier)
  int64_t host_hit_tokens = 0;         // of those, copied back from the host tier
  int32_t host_blocks = 0;             // the host pool: swap space and the host tier
  int32_t host_swap_blocks = 0;        // held by swapped-out requests
  int32_t host_cached_blocks = 0;      // holding a reusable prefix (the host tier)
  int64_t copied_to_host_bytes = 0;    // KV blocks written to host memory (swap-outs, host-tier write-backs)
  int64_t copied_to_device_bytes = 0;  // and read back (swap-ins, host-tier restores)
  double copy_s = 0;                   // device time of those copies (cuda: their own stream)
  double copy_waited_s = 0;            // of it, what a step waited for
  double constraint_mask_s = 0;        // host time filling structured output's masks (the engine thread's)
  int64_t constraint_masked_rows = 0;  // rows sampled under a mask
  int64_t steps = 0;                   // steps the backend ran (0 for a backend that does not count them)
  int64_t engine_steps = 0;            // steps the engine ran: liveness reads progress from it
  uint64_t step_progress = 0;          // Backend::Progress(), read live: progress inside a long step
  double device_busy_s = 0;            // summed device time of the steps (cuda: CUDA events around each step's compute)
  // Speculative decoding (speculative.method): sequence-steps that checked drafts, the tokens drafted, and of those
  // the tokens accepted (each step also samples one more token, not counted here).
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
};

// One request as it ended, for metrics.
struct FinishedRequest {
  FinishReason finish = FinishReason::kNone;
  absl::StatusCode code = absl::StatusCode::kOk;  // kOk unless the engine could not serve it
  Usage usage;
  Timing timing;
  std::vector<double> inter_token_s;  // between consecutive output tokens
};

// One step as it ran, for metrics.
struct StepRecord {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t num_sampled = 0;    // sequences that sampled (each 1 + its accepted drafts tokens)
  int32_t num_drafted = 0;    // drafted tokens the step checked (speculative decoding)
  int32_t num_generated = 0;  // tokens the step added to its sequences (drafts accepted included)
  double wall_s = 0;          // host time from scheduling to the sampled tokens
  double device_s = 0;        // the step's device time (cuda: CUDA events around its compute; cpu: the backend step)
  double cycle_s = 0;         // the engine loop's whole iteration: take requests, schedule, step, outputs
  bool graph = false;         // the backend replayed it from a captured graph (cuda: decode and verify buckets)
  StepCost cost;              // bytes it must read and FLOPs it must do (engine/runtime/step_cost.h)

  // Every sequence computed one token, and its drafts (no prompt chunk in the step).
  bool decode() const { return num_tokens - num_drafted == num_seqs; }
};

// Free memory of the GPU the cuda backend would use, in bytes; 0 when this build has no CUDA or no GPU is
// visible (`inferd plan` then needs the size given).
int64_t VisibleGpuFreeBytes();

// The largest step the scheduler may plan under `config` (its scheduler, block size and speculative sections): what
// the backend measures and captures at start-up, and what `inferd plan` plans.
StepLimits StepLimitsFor(const Config& config);

class Engine {
 public:
  // Loads the model, makes the memory plan and the backend, warms up and starts the step loop.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Config& config);
  // The same with the backend made by `factory` (tests use a fake one).
  using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(const Config&, const Model&)>;
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Config& config, const BackendFactory& factory);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; fails with RESOURCE_EXHAUSTED when scheduler.max_queue requests are already accepted
  // and not yet started (exactly, at every instant), UNAVAILABLE while draining, ALREADY_EXISTS when its id
  // is in use, INVALID_ARGUMENT when its prompt reaches max_model_len. It ends with kLength at max_model_len
  // tokens whatever its max_tokens. Outputs go to request.sink.
  absl::StatusOr<RequestHandle> Submit(Request request);
  // Aborts the waiting or running request with this id at the next step boundary (the public Abort RPC, for
  // ids the caller chose); false if no such request is live.
  bool Abort(const std::string& request_id);
  // Ends the request Submit returned this handle for after its first num_output generated tokens, with
  // finish kStopString, at the next step boundary (the server matched a stop string in its text). Tokens it
  // generated past them are left out of its usage. Ignored once the request finished.
  void StopAt(RequestHandle handle, int32_t num_output);
  // Aborts exactly the request Submit returned this handle for, if it is still live (a cancelled RPC): a
  // later request that reuses its id is never touched.
  void Cancel(RequestHandle handle);
  // New requests are refused from now on; running ones go on.
  void StartDraining() { draining_ = true; }
  // Stops the step loop; requests still waiting or running end with UNAVAILABLE. Idempotent.
  void Stop();
  bool draining() const { return draining_; }

  EngineStats Stats() const;
  // Called on the engine thread when a request ends and after each step; must not block. Set before serving.
  void SetObservers(std::function<void(const FinishedRequest&)> on_request,
                    std::function<void(const StepRecord&)> on_step) {
    on_request_ = std::move(on_request);
    on_step_ = std::move(on_step);
  }
  // Called on the engine thread after each step with the prefix cache's changes since the last call (only with
  // kv_events.enabled); must not block. Events made while no observer is set are dropped.
  void SetKvEventObserver(std::function<void(std::vector<KvCacheEvent>)> on_events) {
    std::lock_guard<std::mutex> lock(kv_events_mu_);
    on_kv_events_ = std::move(on_events);
  }
  const Model& model() const { return *model_; }
  const MemoryPlan& memory_plan() const { return memory_plan_; }
  // Measured at start-up on the device: what bandwidth and FLOPs utilisation are relative to.
  const DeviceCeilings& ceilings() const { return ceilings_; }
  // What runs each operation on the backend's device, as start-up chose it (Backend::KernelChoices).
  const std::vector<KernelChoice>& kernel_choices() const { return kernel_choices_; }
  // The device's sensors now (cuda: NVML); safe from any thread.
  DeviceReading ReadDevice() const { return backend_->ReadDevice(); }
  std::string backend_name() const { return backend_->name(); }
  // Longest prompt + output a request may have: the model's limit, the config's and the pool's.
  int32_t max_model_len() const { return max_model_len_; }
  // Compiles requests' output constraints for this model (thread-safe; request threads call it).
  const ConstraintCompiler& constraint_compiler() const { return *constraint_compiler_; }
  int32_t block_size() const { return config_.engine.block_size; }
  const Config& config() const { return config_; }

 private:
  Engine() = default;
  void Loop();
  void TakeQueued();
  // Ends the request: its blocks go back, its sink gets `out` as the last output. Tokens past keep_tokens
  // (prompt included) are dropped from it first.
  void FinishSequence(Sequence* seq, FinishReason reason, absl::Status error, RequestOutput out = {},
                      size_t keep_tokens = SIZE_MAX);
  static Usage UsageOf(const Sequence& seq, int32_t num_output);
  static Timing TimingOf(const Sequence& seq, absl::Time now);
  void MarkStarted(Sequence* seq, absl::Time now);
  struct InFlight;
  // Builds the step's input and launches it on the backend; null when the launch failed (its requests ended
  // with the error).
  std::unique_ptr<InFlight> LaunchStep(StepPlan plan, double schedule_s);
  // Waits for in_flight_'s tokens and hands them to their requests; clears in_flight_. False if the step
  // failed (its requests ended with the error).
  bool CollectInFlight();
  // Whether the next step may be planned before in_flight_'s tokens are on the host.
  bool CanPlanAhead() const;
  // Fills the constrained rows' masks (timed for the stats).
  void FillMasks(std::span<ConstraintState* const> states, std::span<const std::span<uint32_t>> masks);
  // The masks of a step launched ahead whose constrained rows wait for them, once the step before is collected.
  void SupplyMasks(InFlight& step);
  void PublishStats();

  struct SequenceState;
  // Speculative decoding: whether the next step drafts (speculative.method, max_batch, and adaptive's measured
  // payoff at this batch size); it is then planned after the step in flight is collected.
  bool WantsDrafts();
  // Drafts for the running sequences that decode next (Sequence::drafts), before a step is planned with their last
  // tokens known.
  void ProposeDrafts();
  // A constrained sequence's drafts cut where its constraint refuses one, and the masks of its 1 + k rows filled.
  void ConstrainDrafts(SequenceState& st);

  Config config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ConstraintCompiler> constraint_compiler_;
  std::unique_ptr<ConstraintBatch> constraint_batch_;  // fills a step's masks together (engine thread)
  double constraint_mask_s_ = 0;                       // engine thread; copied into stats_
  int64_t constraint_masked_rows_ = 0;
  std::unique_ptr<SuffixCache> suffix_cache_;  // speculative.method suffix: recent outputs every sequence drafts from
  DraftPayoff draft_payoff_;                   // speculative.adaptive: whether drafting pays at a batch size
  int64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;  // engine thread; copied into stats_
  std::unique_ptr<Backend> backend_;
  MemoryPlan memory_plan_;  // as allocated
  KvGroups kv_groups_;      // the model's KV groups: a block table each per sequence
  DeviceCeilings ceilings_;
  std::vector<KernelChoice> kernel_choices_;
  std::optional<StepCostModel> step_cost_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<BlockPool> host_pool_;  // swap space and the host tier of the prefix cache, or null
  std::unique_ptr<Scheduler> scheduler_;
  int32_t max_model_len_ = 0;
  // Owned by the engine thread.
  std::unordered_map<RequestHandle, std::unique_ptr<SequenceState>> active_;
  std::function<void(const FinishedRequest&)> on_request_;
  std::function<void(const StepRecord&)> on_step_;
  std::vector<KvCacheEvent> kv_events_;  // the pools' changes since the last PublishStats (engine thread)
  std::mutex kv_events_mu_;
  std::function<void(std::vector<KvCacheEvent>)> on_kv_events_;
  int64_t engine_steps_ = 0;
  absl::Time iteration_start_;  // when the loop's current iteration began
  bool plan_ahead_ = false;     // engine.plan_ahead, resolved for the backend
  bool sync_next_ = false;      // the last plan left out what only a step planned with the results in can do
  bool draft_next_ = false;     // this iteration's step drafts (WantsDrafts)
  absl::Time last_collected_ = absl::InfinitePast();  // when the last step's tokens reached the host
  std::unique_ptr<InFlight> in_flight_;               // the step launched and not yet collected
  int64_t launches_ = 0, collections_ = 0;
  // Requests that ended while a launched step still named them, kept until it is collected (by launch count).
  std::vector<std::pair<int64_t, std::unique_ptr<SequenceState>>> retired_;

  // Shared with callers of Submit/Abort.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> submitted_;
  std::vector<RequestHandle> aborts_;
  std::vector<std::pair<RequestHandle, int32_t>> stops_;     // StopAt: handle, generated tokens to keep
  std::unordered_map<std::string, RequestHandle> live_ids_;  // ids submitted and not yet finished
  RequestHandle next_handle_ = 1;
  // Requests accepted, never scheduled and not cancelled, with their prompt tokens: the seats scheduler.max_queue
  // and max_queued_tokens bound. A cancel frees its seat at once, not at the next step boundary.
  std::unordered_map<RequestHandle, int64_t> seats_;
  int64_t not_started_tokens_ = 0;         // the sum of seats_' tokens
  void ReleaseSeat(RequestHandle handle);  // under mu_; nothing if it has none
  bool stop_ = false;
  EngineStats stats_;

  std::atomic<bool> draining_{false};
  std::thread thread_;
};

}  // namespace inferd

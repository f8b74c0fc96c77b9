// The one seam between the engine and the device: a backend owns its weights and the KV pool's memory, and
// turns a step input into sampled token ids. Both the cpu and the cuda backend read the same step input, so
// the scheduler cannot tell them apart. Logits never leave the backend.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv_cache/block_pool.h"
#include "engine/request.h"
#include "engine/runtime/memory_plan.h"

namespace inferd {

// How one logits row becomes a token. Spans point into the sequence and stay valid through Step() or Launch()
// (not until Collect).
struct SamplingRow {
  SamplingParams params;
  double uniform = 0;               // in [0, 1): from the request's seed and `position` only (SamplingUniform)
  int32_t position = 0;             // position the sampled token will take in its sequence
  std::span<const int32_t> tokens;  // prompt then output so far (penalties read it)
  int32_t num_prompt_tokens = 0;
  std::span<const int32_t> banned;  // ids that may not be sampled now (eos/stop ids before min_tokens)
  // Structured output: a bitmask over the vocabulary (bit t % 32 of word t / 32 allows token t; ⌈vocab / 32⌉
  // words), applied after penalties and bias, before temperature and the rest; empty: every token allowed.
  std::span<const uint32_t> allowed;
  // Structured output in a step planned ahead: the mask follows from the token the step before samples, so it comes
  // later, through SupplyMasks, while the device runs the step's forward pass (`allowed` is empty).
  bool allowed_later = false;
  int32_t top_logprobs = 0;  // > 0: report the chosen token's logprob and this many alternatives
  // >= 0: a prompt row (prompt_logprobs). Nothing is sampled: its token is this id, whose raw logprob is reported
  // with top_logprobs alternatives; the other fields are ignored.
  int32_t target = -1;
};

// One step, packed on the host. Tokens of all sequences are concatenated in plan order; a token id may be a
// PendingToken (engine/request.h): one the step launched before this one samples, not yet on the host. The page table
// is in the CSR form paged-attention kernels take: sequence s owns pages [kv_indptr[s], kv_indptr[s + 1]) of each KV
// group's kv_indices, the last holding kv_last_page_len[s] tokens. A model's layers form KV groups
// (engine/model/kv_groups.h; one without sliding windows) that hold the same positions in blocks of their own: KV
// slot of position p of sequence s for a layer of group g: kv_indices[g][kv_indptr[s] + p / block_size] *
// block_size + p % block_size. A window group's page is -1 where no position of the step attends to it (the block
// went back to the pool); a backend never reads it (cuda points it at a block of its own).
struct StepInput {
  int32_t block_size = 0;
  std::vector<int32_t> token_ids;                  // [num_tokens]
  std::vector<int32_t> positions;                  // [num_tokens] position of each token in its sequence
  std::vector<std::vector<int32_t>> slot_mapping;  // [KV groups][num_tokens] KV slot each token's K/V is written to
  std::vector<int32_t> query_start;                // [num_seqs + 1] first token of each sequence; back() = num_tokens
  std::vector<int32_t> context_lens;               // [num_seqs] tokens in the cache once this step's are written
  std::vector<int32_t> kv_indptr;                  // [num_seqs + 1]
  std::vector<std::vector<int32_t>> kv_indices;    // [KV groups][kv_indptr.back()] block ids
  std::vector<int32_t> kv_last_page_len;           // [num_seqs] in [1, block_size]
  // [num_logits] token rows whose logits are computed: first the rows that sample, one per sequence that does (a
  // PendingToken names one of these) or 1 + k for one checking k drafted tokens (speculative decoding: its last 1 + k
  // tokens' rows), then prompt rows (SamplingRow::target); drafted and prompt rows together at most max_num_seqs.
  std::vector<int32_t> logits_indices;
  std::vector<SamplingRow> sampling;  // [num_logits] how each of those rows is sampled

  int32_t num_kv_groups() const { return static_cast<int32_t>(kv_indices.size()); }
  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  int32_t num_logits() const { return static_cast<int32_t>(logits_indices.size()); }
};

struct StepOutput {
  std::vector<int32_t> tokens;         // [num_logits] the sampled token of each logits row
  std::vector<TokenLogprob> logprobs;  // [num_logits]; meaningful only for rows with top_logprobs > 0 or a target
  // A mixture of experts: the experts the step's rows were routed to, each counted once per sparse layer, summed
  // over those layers (what the step read of the experts' weights); -1 where not counted (StepCostModel then
  // expects random routing).
  int64_t experts_touched = -1;
};

// The largest step the scheduler may plan; start-up measures the backend at this shape.
struct StepLimits {
  int32_t max_num_seqs = 0;
  int32_t max_num_batched_tokens = 0;
  int32_t block_size = 0;
  // Speculative decoding: the drafts a sequence checks in one step (speculative.max_tokens; 0: no drafts) and the
  // largest batch that drafts (speculative.max_batch; 0: any). Backends that capture steps ahead (the cuda
  // backend's verify graphs, graph_buckets.h) capture these shapes too.
  int32_t max_drafts = 0;
  int32_t max_draft_batch = 0;

  // Logits rows a step may have: a sampled row per sequence, then up to max_num_seqs rows of drafts and prompts.
  int32_t max_logits_rows() const { return 2 * max_num_seqs; }
};

// Where a backend's time went, summed over every step since start-up.
struct StepCounters {
  int64_t steps = 0;
  double device_busy_s = 0;  // cuda: compute stream from the step's first kernel to its sampled ids (events)
  // The last step alone: host time packing, copying, planning and enqueueing its kernels, and the device time
  // of its compute (cuda; 0 for a backend that does not measure).
  double last_prepare_s = 0;
  double last_device_s = 0;
  double last_idle_before_s = 0;           // cuda: device time from the previous step's compute to this one's
  bool last_graph = false;                 // cuda: the last step collected was replayed from a captured graph
  int64_t steps_ordered_after_copies = 0;  // cuda: steps that wrote a block a copy still touched, so waited for it
  double copy_busy_s = 0;                  // cuda: device time of the KV block copies (the copy stream)
  double copy_waited_s = 0;  // of it, the part the steps' stream waited for (the rest ran under compute or idle)
  // cuda: the last step's compute on the device clock (ms since the KV pool was allocated); -1 where not measured.
  double last_compute_start_ms = -1, last_compute_end_ms = -1;
};

// One batch of KV block copies on the device clock of StepCounters (cuda: the copy stream, from its first copy to
// its last): with the steps' compute intervals, a timeline of both streams (engine.profile_steps logs both).
struct CopyTiming {
  uint64_t ticket = 0;
  int32_t blocks_out = 0, blocks_in = 0;
  double start_ms = 0, end_ms = 0;
  double waited_ms = 0;  // how long the steps' stream waited for it
};

// How fast the device can read memory and multiply matrices, measured once at start-up with small kernels on
// the device itself: the denominators of bandwidth and FLOPs utilisation.
struct DeviceCeilings {
  double read_bytes_per_s = 0;       // a large read-only reduction (cuda: 1 GiB of device memory)
  double gemm_flops_per_s = 0;       // the backend's own matrix product at a large square shape
  std::string read_test, gemm_test;  // what was measured, in words
};

// The device's sensors (cuda: NVML); a field is empty where the device does not report it.
struct DeviceReading {
  std::optional<double> utilization;  // share of the last sample period a kernel ran, [0, 1]
  std::optional<double> memory_used_bytes;
  std::optional<double> power_w;
  std::optional<double> temperature_c;
  std::optional<double> sm_clock_hz;
  std::optional<double> energy_j;  // consumed since the driver loaded
};

// An operation of a step and what runs it on this backend's device ("attention": "FlashInfer's ...").
struct KernelChoice {
  std::string op, choice;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Fills the device, weight, activation and KV-block fields of a memory plan. The cuda backend runs a
  // dummy step at the largest shape and measures what it took; num_blocks is left to SizeKvPool.
  virtual absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) = 0;
  // Allocates the KV pool of plan.num_blocks blocks. Called once, before the first Step.
  virtual absl::Status AllocateKvCache(const MemoryPlan& plan) = 0;
  // The host pool of num_blocks KV blocks (swap space and the prefix cache's host tier, MemoryPlan::
  // num_host_blocks). Called once, after AllocateKvCache, only when either is configured.
  virtual absl::Status AllocateHostBlocks(int32_t num_blocks) = 0;
  // Starts a batch of block copies (StepPlan::copies): each `out` device block to its host block, then each `in`
  // host block to its device block, after everything launched before (a block is read once the steps writing it
  // ran). A later step that writes a block the batch reads or writes runs after the batch; nothing else waits
  // for it (cuda: a copy stream, ordered with the steps' stream by events). cpu: the copies are done on return.
  virtual absl::Status StartCopies(const CopyBatch& batch) = 0;
  // The ticket up to which every batch started has completed.
  virtual uint64_t CompletedCopies() = 0;
  // Blocks until batch `ticket` (and every one before it) completed.
  virtual absl::Status WaitForCopies(uint64_t ticket) = 0;
  // Runs the model over the step's tokens, writing their K/V into the pool, and samples one token for
  // every logits row. Nothing else may be launched and not collected.
  virtual absl::Status Step(const StepInput& input, StepOutput* output) = 0;
  // The same in two halves, so that the host plans step N + 1 while the device runs step N: Launch starts a
  // step and returns (cuda: once its work is queued on the device), Collect waits for the oldest launched
  // step and gives its tokens. At most two steps are launched and not collected. A PendingToken(r) in the
  // step's ids is row r's token of the step launched just before it, read where it lands. This default, for
  // a backend that cannot overlap (cpu), runs the step in Launch.
  virtual absl::Status Launch(const StepInput& input);
  virtual absl::Status Collect(StepOutput* output);
  // The masks of the last launched step's rows that take theirs later (SamplingRow::allowed_later), in row order,
  // each ⌈vocab / 32⌉ words: called once for such a step, after its Launch and before anything else is launched or
  // that step is collected (cuda: the step's sampling waits on the device for them; its forward pass does not).
  // The default, for a backend whose Launch runs the step, runs it here.
  virtual absl::Status SupplyMasks(std::span<const std::span<const uint32_t>> masks);
  // Read by the engine thread only (the engine copies it out for others).
  virtual StepCounters counters() const { return {}; }
  // Work finished inside steps, counted while a step runs (cpu: a layer of a shard, a row of attention); safe from any
  // thread. Liveness reads it to tell a long step from a stuck one. 0 for a backend whose steps are short (cuda: a
  // whole step is the unit, and a stuck kernel stops every step).
  virtual uint64_t Progress() const { return 0; }
  // The copy batches completed since the last call, oldest first (cuda keeps the last 4096; none elsewhere).
  virtual std::vector<CopyTiming> TakeCopyTimings() { return {}; }
  // Measures the ceilings. Called once at start-up, after MeasureMemory and before AllocateKvCache, so that its
  // temporary buffers are back before the KV pool takes what is left.
  virtual absl::StatusOr<DeviceCeilings> MeasureCeilings() { return DeviceCeilings{}; }
  // Reads the sensors; safe from any thread. Empty for a backend without them.
  virtual DeviceReading ReadDevice() const { return {}; }
  // Which kernels run each operation on this device, as start-up chose them (after AllocateKvCache: the choices
  // measured there included), in the order the start-up log and GetServerInfo state them.
  virtual std::vector<KernelChoice> KernelChoices() const { return {}; }

 private:
  struct Launched {
    absl::Status status;
    StepOutput output;
  };
  // The default Launch's step whose masks come later, with what its rows' spans point to (the engine may move those
  // once Launch returns): run by SupplyMasks.
  struct Deferred {
    StepInput input;
    std::vector<std::vector<int32_t>> tokens, banned;
    std::vector<std::vector<uint32_t>> allowed;
  };
  std::optional<Deferred> deferred_;
  void Run(const StepInput& input);
  std::deque<Launched> launched_;      // the default Launch's results, oldest first
  std::vector<int32_t> last_sampled_;  // the default Launch's last step's tokens
};

}  // namespace inferd

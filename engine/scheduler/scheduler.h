// Continuous batching: decides, step by step, which sequences run and how many tokens each computes.
// Pure logic over a BlockPool; it owns no tensors and no threads.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/kv_cache/block_pool.h"
#include "engine/scheduler/sequence.h"

namespace inferd {

struct SchedulerLimits {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t block_size = 16;
  bool prefix_caching = false;  // a new sequence reuses cached full blocks of its longest known prefix
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t start = 0;         // first position computed this step (= num_computed before the step)
  int32_t num_new = 0;       // tokens computed this step: 1 for decode, a chunk for prefill
  bool wants_token = false;  // this step reaches the sequence's last token, so it samples the next one
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;    // running sequences first, then newly admitted ones
  std::vector<Sequence*> preempted;  // sent back to waiting this step; their blocks are free
  int32_t num_tokens = 0;            // sum of num_new
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, BlockPool* pool);

  // Queues a new sequence at the back of the waiting queue.
  void Add(Sequence* seq);
  // Chooses this step's batch: running sequences first (preempting the most recent when blocks run
  // out), then waiting ones while the token budget, max_num_seqs and free blocks allow.
  StepPlan Schedule();
  // Applies a step's results: advances num_computed, appends the sampled token of each sequence that
  // wanted one (sampled[i] belongs to the i-th such sequence in plan order).
  void Update(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // Removes a sequence wherever it is (finished or aborted) and frees its blocks at once.
  void Finish(Sequence* seq);

  const std::deque<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const SchedulerLimits& limits() const { return limits_; }

 private:
  bool AllocateFor(Sequence* seq, int32_t num_tokens);
  // Takes the cached blocks of seq's longest known prefix (all but its last token) and counts them computed.
  void ReusePrefix(Sequence* seq);
  // Registers seq's blocks that are full and computed, so later sequences can reuse them.
  void RememberFullBlocks(Sequence* seq);
  void DropBlocks(Sequence* seq);
  void Preempt(Sequence* seq);

  SchedulerLimits limits_;
  BlockPool* pool_;
  std::deque<Sequence*> waiting_;
  std::deque<Sequence*> running_;
};

}  // namespace inferd

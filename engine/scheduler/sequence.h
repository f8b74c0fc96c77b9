// The engine's state of one request between arrival and finish.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/request.h"

namespace inferd {

// A block table's entry for a block a sliding-window group let go: no position still to come attends to it.
inline constexpr int32_t kNoBlock = -1;

struct Sequence {
  uint64_t seq_id = 0;
  Request request;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int32_t num_prompt_tokens = 0;
  int32_t num_computed = 0;  // tokens whose K/V are in the cache
  int32_t num_scored = 0;    // prompt_logprobs: prompt positions whose row has been computed
  // Per KV group (SchedulerLimits::kv_windows; one for a model without sliding windows) the blocks of its tokens:
  // token i's K/V for the group's layers live in block_tables[g][i / block_size] (kNoBlock: let go).
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<uint64_t> block_keys;  // prefix-cache keys of its full, computed blocks, the same for every group
  int32_t num_cached_tokens = 0;     // prompt tokens taken from the prefix cache when it was first admitted
  int32_t num_preemptions = 0;
  int32_t tokens_at_preemption = 0;  // num_tokens() when last preempted: until it grows, it is not preempted again
  uint64_t admitted_order = 0;       // increases with every admission: the most recent is preempted first
  // While swapped out: the host blocks holding its first num_computed tokens' KV, shaped as block_tables (empty:
  // not swapped out).
  std::vector<std::vector<int32_t>> swapped_blocks;
  struct HostBlock {
    int32_t group = 0, index = 0, block = 0;
  };
  std::vector<HostBlock> restoring;  // host-tier blocks found for its prefix, until they are copied in
  uint64_t loading_ticket = 0;       // its KV comes in with this copy batch: it runs once the batch completed
  bool finished = false;             // ended while a launched step still holds it: that step's row is dropped
  // Speculative decoding: tokens proposed to follow its last one, checked in its next step if the scheduler grants
  // them (it may cut them short); they are not its tokens until accepted (Scheduler::Resolve).
  std::vector<int32_t> drafts;

  absl::Time arrival;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int32_t priority() const { return request.priority; }
  // prompt_logprobs: prompt token p + 1 is scored by the logits row of position p. Its positions still to score.
  bool scoring() const { return request.prompt_logprobs.has_value() && num_scored < num_prompt_tokens - 1; }
  // The positions a step computing [start, start + n) scores: [first, last), empty when last <= first.
  std::pair<int32_t, int32_t> PromptRows(int32_t start, int32_t n) const {
    if (!request.prompt_logprobs) return {start, start};
    return {std::max(start, num_scored), std::min(start + n, num_prompt_tokens - 1)};
  }
  // Preempted and not yet past the point it was preempted at: preempting it again would only throw work away.
  bool awaiting_progress() const { return num_preemptions > 0 && num_tokens() <= tokens_at_preemption; }
};

}  // namespace inferd

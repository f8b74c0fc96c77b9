// The capacity decisions of a step: do a sequence's blocks fit, which cached prefix a new sequence reuses, and
// who is preempted when blocks (or sequence slots) run out. Batch composition — token budget, chunk sizes,
// max_num_seqs, order — is the scheduler's (scheduler.h). Pure logic over a BlockPool.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/kv_cache/block_pool.h"
#include "engine/scheduler/sequence.h"

namespace inferd {

struct CapacityCounters {
  int64_t preemptions = 0;          // sequences sent back to waiting
  int64_t preempted_tokens = 0;     // computed tokens those preemptions threw away (recomputed later)
  int64_t swapped_preemptions = 0;  // of the preemptions, those that kept their KV in host swap space
  int64_t swapped_blocks = 0;       // blocks copied to the host by them
  int64_t prefix_query_tokens = 0;  // prompt tokens of first admissions, looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;    // of those, taken from cached blocks
};

class Capacity {
 public:
  // swap_pool: host swap space (engine.swap_space_gib), or null when preemption always recomputes.
  Capacity(int32_t block_size, bool prefix_caching, BlockPool* pool, BlockPool* swap_pool = nullptr)
      : block_size_(block_size), prefix_caching_(prefix_caching), pool_(pool), swap_pool_(swap_pool) {}

  // Gives seq blocks for its first num_tokens tokens, if `headroom` blocks stay free after; false (nothing
  // taken) otherwise.
  bool Grow(Sequence* seq, int32_t num_tokens, int32_t headroom = 0);
  // Takes the cached blocks of seq's longest known prefix (all but its last token) and counts them computed.
  // For a sequence holding no blocks.
  void ReusePrefix(Sequence* seq);
  // Records an admission: on the first, its reused prompt tokens (usage.cached_prompt_tokens, hit counters).
  void Admitted(Sequence* seq);
  // Registers seq's blocks that are full and computed, so later sequences can reuse them.
  void RememberFullBlocks(Sequence* seq);
  // Frees seq's blocks (full computed ones stay cached) and forgets its progress.
  void Release(Sequence* seq);
  // Preempts seq and releases its device blocks; the caller requeues it. With swap space free for its computed
  // blocks they are copied out (appended to swap_out, kept in seq->swapped_blocks) and nothing is lost;
  // otherwise it recomputes later and the work lost is counted.
  void Preempt(Sequence* seq, std::vector<BlockCopy>* swap_out);
  // For a swapped-out sequence: device blocks for its first num_tokens tokens if `headroom` stay free after,
  // its swapped blocks copied in (appended to swap_in); false (nothing taken) otherwise. The host blocks are
  // free again at the next step (after the copies ran).
  bool SwapIn(Sequence* seq, int32_t num_tokens, int32_t headroom, std::vector<BlockCopy>* swap_in);
  // Frees the host blocks of the last step's swap-ins; once per step, before anything is swapped out.
  void ReleaseSwappedIn();
  // Removes a finished sequence's blocks, device and host.
  void Finish(Sequence* seq);

  // Who to preempt among `candidates` to make room for `for_seq`: the lowest priority, then the most recently
  // admitted; only priorities below `below` (INT32_MAX for any); unless spare_awaiting is false, never one
  // awaiting progress since its last preemption. nullptr when none qualifies.
  static Sequence* ChooseVictim(const std::vector<Sequence*>& candidates, const Sequence* for_seq, int32_t below,
                                bool spare_awaiting = true);

  const CapacityCounters& counters() const { return counters_; }
  const BlockPool& pool() const { return *pool_; }

 private:
  int32_t block_size_;
  bool prefix_caching_;
  BlockPool* pool_;
  BlockPool* swap_pool_;
  std::vector<int32_t> swapped_in_;  // host blocks read by this step's swap-ins
  CapacityCounters counters_;
};

}  // namespace inferd

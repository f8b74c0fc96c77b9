// The capacity decisions of a step: do a sequence's blocks fit, which cached prefix a new sequence reuses, and
// who is preempted when blocks (or sequence slots) run out. Batch composition — token budget, chunk sizes,
// max_num_seqs, order — is the scheduler's (scheduler.h). Pure logic over a BlockPool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
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
  int64_t prefix_hit_tokens = 0;    // of those, taken from cached blocks (either tier)
  int64_t host_hit_tokens = 0;      // of those, copied back from the host tier
  int64_t offloaded_blocks = 0;     // evicted device prefix blocks written back to the host tier
  int64_t restored_blocks = 0;      // host-tier blocks copied into device blocks for a new sequence
  int64_t swapped_in_blocks = 0;    // swapped-out blocks copied back
};

// The host pool's shares: swap space (engine.swap_space_gib) and the host tier of the prefix cache
// (engine.host_kv_cache_gib) are one BlockPool of both sizes together; swapped-out sequences hold at most
// swap_blocks of it, the host tier caches full prefix blocks in every block not held (least recently used
// evicted first, by swaps too).
struct HostShares {
  int32_t swap_blocks = 0;
  bool cache = false;  // the host tier is on (prefix caching with engine.host_kv_cache_gib > 0)
};

class Capacity {
 public:
  // host_pool: the host pool (swap space and host tier), or null when preemption always recomputes and the
  // prefix cache has one tier. kv_windows: per KV group (engine/model/kv_groups.h) its sliding window in tokens, 0
  // for global attention; a sequence holds a block table per group.
  Capacity(int32_t block_size, bool prefix_caching, BlockPool* pool, BlockPool* host_pool = nullptr,
           HostShares shares = {}, std::vector<int32_t> kv_windows = {0})
      : block_size_(block_size),
        prefix_caching_(prefix_caching),
        pool_(pool),
        host_pool_(host_pool),
        shares_(shares),
        windows_(std::move(kv_windows)) {}

  int32_t num_groups() const { return static_cast<int32_t>(windows_.size()); }
  // The first block of group g that a step computing from position `start` on reads: 0 for a global group; a
  // window group's positions before start - window + 1 are seen by no later position.
  int32_t FirstNeeded(int32_t group, int32_t start) const {
    const int32_t w = windows_[group];
    return w == 0 ? 0 : std::max(0, start - w + 1) / block_size_;
  }
  // A prefix-cache key as group g's blocks are remembered under: the group's own key (group 0: the key itself).
  static uint64_t GroupKey(uint64_t key, int32_t group);
  // Every block a sequence's tables (block_tables or swapped_blocks: all groups) hold.
  static std::vector<int32_t> HeldBlocks(const std::vector<std::vector<int32_t>>& tables);

  // Gives seq blocks for its tokens up to num_tokens (every group's that the step from seq->num_computed on reads or
  // writes; a window group's blocks behind them go back first), if `headroom` blocks stay free after; false (no
  // block taken) otherwise. Cached blocks it takes are written back to the host tier (copies appended to batch->out).
  bool Grow(Sequence* seq, int32_t num_tokens, int32_t headroom, CopyBatch* batch);
  // Takes the cached blocks of seq's longest known prefix (all but its last token) and counts them computed: each
  // from the device tier, else the host tier's (held in seq->restoring until Restore or Release). The prefix is the
  // longest whose blocks every global group finds, and each window group those its window reaches back to. For a
  // sequence holding no blocks.
  void ReusePrefix(Sequence* seq);
  // For a sequence with host-tier blocks to restore: device blocks for its computed tokens if `headroom` stay
  // free after, the host blocks copied in (batch->in); it loads until the batch completes. False (nothing
  // taken; the caller releases it) otherwise.
  bool Restore(Sequence* seq, int32_t headroom, CopyBatch* batch);
  // Records an admission: on the first, its reused prompt tokens (usage.cached_prompt_tokens, hit counters).
  void Admitted(Sequence* seq);
  // Registers seq's blocks that are full and computed, so later sequences can reuse them.
  void RememberFullBlocks(Sequence* seq);
  // Gives back seq's blocks past those its tokens need (every group's): the blocks a step took for drafted
  // tokens that were rejected. Their K/V was never remembered (it is not of the sequence's tokens).
  void Shrink(Sequence* seq);
  // Frees seq's blocks (full computed ones stay cached) and forgets its progress.
  void Release(Sequence* seq);
  // Preempts seq and releases its device blocks; the caller requeues it. With swap space free for its computed
  // blocks they are copied out (batch->out, kept in seq->swapped_blocks) and nothing is lost; otherwise it
  // recomputes later and the work lost is counted.
  void Preempt(Sequence* seq, CopyBatch* batch);
  // For a swapped-out sequence: device blocks for its computed tokens if `headroom` stay free after, its swapped
  // blocks copied in (batch->in); it loads until the batch completes, when the host blocks are free again.
  // False (nothing taken) otherwise.
  bool SwapIn(Sequence* seq, int32_t headroom, CopyBatch* batch);
  // Writes back to the host tier, ahead of their eviction, up to `max_blocks` of the cached device blocks next in
  // line to be evicted that the host tier does not hold yet (they stay cached on the device): so that the step
  // which later takes such a block finds its copy done instead of waiting for it.
  void WriteAhead(int32_t max_blocks, CopyBatch* batch);
  // Copy batches up to `ticket` completed: the host blocks they read or wrote are released.
  void CopiesCompleted(uint64_t ticket);
  // Removes a finished sequence's blocks, device and host.
  void Finish(Sequence* seq);
  // Host blocks held by copies in flight, once per hold (a block read by two batches is there twice).
  std::vector<int32_t> host_blocks_in_flight() const;

  // Who to preempt among `candidates` to make room for `for_seq`: the lowest priority, then the most recently
  // admitted; only priorities below `below` (INT32_MAX for any); unless spare_awaiting is false, never one
  // awaiting progress since its last preemption. nullptr when none qualifies.
  static Sequence* ChooseVictim(const std::vector<Sequence*>& candidates, const Sequence* for_seq, int32_t below,
                                bool spare_awaiting = true);

  const CapacityCounters& counters() const { return counters_; }
  const BlockPool& pool() const { return *pool_; }
  int32_t swap_blocks_held() const { return swap_held_; }

 private:
  // Takes n free device blocks; the cached ones among them are written back to the host tier first.
  std::vector<int32_t> AllocateDevice(int32_t n, CopyBatch* batch);
  // Copies a cached device block's contents to a host block that then holds its prefix (if the host tier does not
  // know the key and has a block to give); returns whether it did.
  bool WriteBack(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool announced,
                 CopyBatch* batch);
  // Lets go of the window groups' blocks that no position from `start` on attends to.
  void Trim(Sequence* seq, int32_t start);
  // Host blocks a batch reads or writes stay held until it completes.
  void HoldUntilDone(const CopyBatch& batch, std::span<const int32_t> host_blocks);

  int32_t block_size_;
  bool prefix_caching_;
  BlockPool* pool_;
  BlockPool* host_pool_;
  HostShares shares_;
  std::vector<int32_t> windows_;  // [KV groups]
  int32_t swap_held_ = 0;         // host blocks held by swapped-out sequences
  struct Held {
    uint64_t ticket;
    std::vector<int32_t> host_blocks;
  };
  std::deque<Held> in_flight_;  // by ticket
  CapacityCounters counters_;
};

}  // namespace inferd

// The paged KV-cache block pool: which blocks are free, how many sequences hold each one, and which full
// blocks still hold a known prefix (prefix caching). It holds ids, reference counts and token ids only; the
// backend owns the memory the ids index.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace inferd {

// A cached block that Allocate handed out again: the prefix it held (a host tier may keep a copy).
struct EvictedBlock {
  int32_t block = 0;
  uint64_t key = 0, parent = 0;
  std::vector<int32_t> tokens;
  bool announced = true;  // its key was an event (Remember's `announce`)
};

// A change to what a pool's prefix cache can find (vLLM's KV-cache events, which routers subscribe to): a full
// block became findable by its key (the chained hash of its parent's key and its tokens), stopped being, or
// every block was forgotten.
struct KvCacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  uint64_t key = 0, parent = 0;  // parent: 0 for a sequence's first block
  std::vector<int32_t> tokens;   // kStored: the block's tokens
  bool host = false;             // the host tier's pool (medium "CPU"), else the device's ("GPU")
};

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_total() const { return static_cast<int32_t>(ref_counts_.size()); }
  // Blocks no sequence holds, cached ones included (those are evicted, oldest first, when needed).
  int32_t num_free() const { return num_free_; }
  // Free blocks that still hold a cached prefix.
  int32_t num_cached() const { return num_cached_free_; }
  bool CanAllocate(int32_t n) const { return n <= num_free(); }

  // Takes n free blocks (ref count 1 each), the least recently freed first; a cached one forgets its prefix
  // (appended to *evicted when given). The caller must have checked CanAllocate.
  [[nodiscard]] std::vector<int32_t> Allocate(int32_t n, std::vector<EvictedBlock>* evicted = nullptr);
  // Drops one reference to each block; a block with no references is free again (and stays cached).
  void Free(std::span<const int32_t> blocks);
  int32_t RefCount(int32_t block) const;

  // Prefix caching. A full block is keyed by a chained hash of (the previous block's key, its token ids); the
  // tokens are kept too, so a hash collision can never hand out a wrong block.
  static uint64_t BlockKey(uint64_t parent_key, std::span<const int32_t> tokens);
  // Marks a full, computed block as holding these tokens after `parent_key` (key = BlockKey(parent_key,
  // tokens)); the first block with a key wins. `announce`: its key's storing and removal are events (RecordEvents);
  // the blocks of a model's further KV groups are not (a router knows a prefix by its first group's keys).
  void Remember(int32_t block, uint64_t key, uint64_t parent_key, std::span<const int32_t> tokens,
                bool announce = true);
  // A block holding exactly these tokens under this key, with one more reference taken; nullopt if none.
  std::optional<int32_t> Reuse(uint64_t key, std::span<const int32_t> tokens);
  // Whether Reuse would find a block (nothing taken).
  bool Holds(uint64_t key, std::span<const int32_t> tokens) const;
  // Whether a block holds this key (whatever its tokens: a collision is not stored twice).
  bool Knows(uint64_t key) const { return by_key_.count(key) > 0; }
  // Up to n cached free blocks, the next to be evicted first, among the `scan` least recently freed.
  std::vector<int32_t> NextEvicted(int32_t n, int32_t scan) const;
  uint64_t KeyOf(int32_t block) const { return key_[block]; }
  uint64_t ParentOf(int32_t block) const { return parent_[block]; }
  bool AnnouncedOf(int32_t block) const { return announced_[block] != 0; }
  // From now on every key this pool starts or stops holding is appended to *events (null: none), marked as
  // the host tier's when `host`. The caller drains *events.
  void RecordEvents(std::vector<KvCacheEvent>* events, bool host) {
    events_ = events;
    host_ = host;
  }
  std::span<const int32_t> TokensOf(int32_t block) const { return tokens_[block]; }

  // Aborts naming the broken invariant: free list and ref counts disagree, duplicates, bad ids.
  void CheckInvariants() const;

 private:
  void Unlink(int32_t block);
  void PushBack(int32_t block);
  void Forget(int32_t block);

  std::vector<int32_t> ref_counts_;  // [num_blocks]
  // Free blocks in a doubly linked list, least recently freed at the head: prev_/next_ index it, -1 ends it.
  std::vector<int32_t> prev_, next_;
  std::vector<char> on_free_list_;
  int32_t head_ = -1, tail_ = -1, num_free_ = 0, num_cached_free_ = 0;
  // Cached prefixes: key of each block (0 = none), its tokens, and the block of each key.
  std::vector<uint64_t> key_, parent_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<char> announced_;
  std::vector<KvCacheEvent>* events_ = nullptr;
  bool host_ = false;
  std::unordered_map<uint64_t, int32_t> by_key_;
};

// A KV block copied between the device pool and the host pool (swap space and the host tier of the prefix
// cache).
struct BlockCopy {
  int32_t device_block = 0;
  int32_t host_block = 0;
  bool operator==(const BlockCopy&) const = default;
};

// The block copies one step asks for, run on the copy stream: `out` (device → host: swap-outs and write-backs of
// evicted prefix blocks), then `in` (host → device: swap-ins and host-tier restores). Tickets number the batches
// that hold copies from 1 up; a batch completes in order after the ones before it.
struct CopyBatch {
  uint64_t ticket = 0;  // 0: no copies
  std::vector<BlockCopy> out, in;
  bool empty() const { return out.empty() && in.empty(); }
};

// Blocks needed to hold num_tokens tokens.
inline int32_t BlocksFor(int32_t num_tokens, int32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace inferd

#include "engine/kv_cache/block_pool.h"

#include <algorithm>

#include "engine/check.h"

namespace inferd {

BlockPool::BlockPool(int32_t num_blocks)
    : ref_counts_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      on_free_list_(num_blocks, 0),
      key_(num_blocks, 0),
      parent_(num_blocks, 0),
      tokens_(num_blocks),
      announced_(num_blocks, 0) {
  INFERD_CHECK(num_blocks > 0, "a block pool has at least one block");
  for (int32_t b = 0; b < num_blocks; ++b) PushBack(b);  // lowest ids handed out first
}

void BlockPool::PushBack(int32_t b) {
  prev_[b] = tail_;
  next_[b] = -1;
  if (tail_ >= 0) next_[tail_] = b;
  tail_ = b;
  if (head_ < 0) head_ = b;
  on_free_list_[b] = 1;
  ++num_free_;
  if (key_[b] != 0) ++num_cached_free_;
}

void BlockPool::Unlink(int32_t b) {
  if (prev_[b] >= 0) next_[prev_[b]] = next_[b];
  if (next_[b] >= 0) prev_[next_[b]] = prev_[b];
  if (head_ == b) head_ = next_[b];
  if (tail_ == b) tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  on_free_list_[b] = 0;
  --num_free_;
  if (key_[b] != 0) --num_cached_free_;
}

void BlockPool::Forget(int32_t b) {
  if (key_[b] == 0) return;
  auto it = by_key_.find(key_[b]);
  if (it != by_key_.end() && it->second == b) by_key_.erase(it);
  if (events_ && announced_[b]) events_->push_back({KvCacheEvent::Kind::kRemoved, key_[b], 0, {}, host_});
  key_[b] = 0;
  announced_[b] = 0;
  parent_[b] = 0;
  tokens_[b].clear();
}

std::vector<int32_t> BlockPool::Allocate(int32_t n, std::vector<EvictedBlock>* evicted) {
  INFERD_CHECK(n >= 0 && n <= num_free(), "Allocate is called only for blocks that are free");
  std::vector<int32_t> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    Unlink(b);
    if (evicted && key_[b] != 0) evicted->push_back({b, key_[b], parent_[b], tokens_[b], announced_[b] != 0});
    Forget(b);  // evicted: its prefix is gone
    INFERD_CHECK(ref_counts_[b] == 0, "a free block has no references");
    ref_counts_[b] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    INFERD_CHECK(b >= 0 && b < num_total(), "freed block ids are in range");
    INFERD_CHECK(ref_counts_[b] > 0, "a block is not freed twice");
    if (--ref_counts_[b] == 0) PushBack(b);
  }
}

std::vector<int32_t> BlockPool::NextEvicted(int32_t n, int32_t scan) const {
  std::vector<int32_t> out;
  for (int32_t b = head_; b >= 0 && scan-- > 0 && static_cast<int32_t>(out.size()) < n; b = next_[b]) {
    if (key_[b] != 0) out.push_back(b);
  }
  return out;
}

int32_t BlockPool::RefCount(int32_t block) const {
  INFERD_CHECK(block >= 0 && block < num_total(), "block id in range");
  return ref_counts_[block];
}

uint64_t BlockPool::BlockKey(uint64_t parent_key, std::span<const int32_t> tokens) {
  // SplitMix64-style mixing of the parent key and every token id; 0 is reserved for "no key".
  uint64_t h = parent_key ^ 0x9E3779B97F4A7C15ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  return h == 0 ? 1 : h;
}

void BlockPool::Remember(int32_t block, uint64_t key, uint64_t parent_key, std::span<const int32_t> tokens,
                         bool announce) {
  INFERD_CHECK(block >= 0 && block < num_total() && ref_counts_[block] > 0, "a remembered block is held");
  if (key_[block] != 0 || by_key_.count(key)) return;  // already known (this block, or another one)
  key_[block] = key;
  parent_[block] = parent_key;
  tokens_[block].assign(tokens.begin(), tokens.end());
  announced_[block] = announce;
  by_key_.emplace(key, block);
  if (events_ && announce) events_->push_back({KvCacheEvent::Kind::kStored, key, parent_key, tokens_[block], host_});
}

bool BlockPool::Holds(uint64_t key, std::span<const int32_t> tokens) const {
  auto it = by_key_.find(key);
  return it != by_key_.end() &&
         std::equal(tokens.begin(), tokens.end(), tokens_[it->second].begin(), tokens_[it->second].end());
}

std::optional<int32_t> BlockPool::Reuse(uint64_t key, std::span<const int32_t> tokens) {
  if (!Holds(key, tokens)) return std::nullopt;
  const int32_t b = by_key_.at(key);
  if (ref_counts_[b] == 0) Unlink(b);
  ++ref_counts_[b];
  return b;
}

void BlockPool::CheckInvariants() const {
  std::vector<char> seen(ref_counts_.size(), 0);
  int32_t count = 0, cached = 0;
  for (int32_t b = head_, prev = -1; b >= 0; prev = b, b = next_[b]) {
    INFERD_CHECK(b >= 0 && b < num_total(), "free list holds valid ids");
    INFERD_CHECK(!seen[b], "free list holds no duplicates");
    INFERD_CHECK(prev_[b] == prev, "free list links agree both ways");
    INFERD_CHECK(ref_counts_[b] == 0, "blocks on the free list have no references");
    seen[b] = 1;
    ++count;
    cached += key_[b] != 0;
  }
  INFERD_CHECK(count == num_free_ && cached == num_cached_free_, "free and cached counts match the list");
  for (int32_t b = 0; b < num_total(); ++b) {
    INFERD_CHECK(ref_counts_[b] >= 0, "ref counts are never negative");
    INFERD_CHECK(seen[b] || ref_counts_[b] > 0, "a block with no references is on the free list (no leak)");
    INFERD_CHECK(key_[b] == 0 || by_key_.at(key_[b]) == b, "a cached block is found by its key");
  }
}

}  // namespace inferd

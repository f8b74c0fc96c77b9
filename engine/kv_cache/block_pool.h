// The paged KV-cache block pool: which blocks are free and how many sequences hold each one.
// It holds ids and reference counts only; the backend owns the memory the ids index.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace inferd {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_total() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  bool CanAllocate(int32_t n) const { return n <= num_free(); }

  // Takes n free blocks (ref count 1 each). The caller must have checked CanAllocate.
  [[nodiscard]] std::vector<int32_t> Allocate(int32_t n);
  // Drops one reference to each block; a block with no references is free again.
  void Free(std::span<const int32_t> blocks);
  int32_t RefCount(int32_t block) const;

  // Aborts naming the broken invariant: free list and ref counts disagree, duplicates, bad ids.
  void CheckInvariants() const;

 private:
  std::vector<int32_t> ref_counts_;  // [num_blocks]
  std::vector<int32_t> free_;        // stack of free block ids; lowest ids handed out first
};

// Blocks needed to hold num_tokens tokens.
inline int32_t BlocksFor(int32_t num_tokens, int32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace inferd

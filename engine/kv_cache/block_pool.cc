#include "engine/kv_cache/block_pool.h"

#include "engine/check.h"

namespace inferd {

BlockPool::BlockPool(int32_t num_blocks) : ref_counts_(num_blocks, 0) {
  INFERD_CHECK(num_blocks > 0, "a block pool has at least one block");
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::vector<int32_t> BlockPool::Allocate(int32_t n) {
  INFERD_CHECK(n >= 0 && n <= num_free(), "Allocate is called only for blocks that are free");
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (int32_t b : out) {
    INFERD_CHECK(ref_counts_[b] == 0, "a free block has no references");
    ref_counts_[b] = 1;
  }
  return out;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    INFERD_CHECK(b >= 0 && b < num_total(), "freed block ids are in range");
    INFERD_CHECK(ref_counts_[b] > 0, "a block is not freed twice");
    if (--ref_counts_[b] == 0) free_.push_back(b);
  }
}

int32_t BlockPool::RefCount(int32_t block) const {
  INFERD_CHECK(block >= 0 && block < num_total(), "block id in range");
  return ref_counts_[block];
}

void BlockPool::CheckInvariants() const {
  std::vector<char> seen(ref_counts_.size(), 0);
  for (int32_t b : free_) {
    INFERD_CHECK(b >= 0 && b < num_total(), "free list holds valid ids");
    INFERD_CHECK(!seen[b], "free list holds no duplicates");
    INFERD_CHECK(ref_counts_[b] == 0, "blocks on the free list have no references");
    seen[b] = 1;
  }
  for (int32_t b = 0; b < num_total(); ++b) {
    INFERD_CHECK(ref_counts_[b] >= 0, "ref counts are never negative");
    INFERD_CHECK(seen[b] || ref_counts_[b] > 0, "a block with no references is on the free list (no leak)");
  }
}

}  // namespace inferd

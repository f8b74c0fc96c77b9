#include "engine/kv_cache/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace inferd {
namespace {

TEST(BlockPool, AllocateAndFreeReturnsEveryBlock) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_free(), 8);
  const std::vector<int32_t> a = pool.Allocate(3);
  const std::vector<int32_t> b = pool.Allocate(5);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_FALSE(pool.CanAllocate(1));
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 8u) << "no block handed out twice";
  pool.Free(a);
  EXPECT_EQ(pool.num_free(), 3);
  pool.Free(b);
  EXPECT_EQ(pool.num_free(), 8);
  pool.CheckInvariants();
}

TEST(BlockPool, BlocksFor) {
  EXPECT_EQ(BlocksFor(0, 16), 0);
  EXPECT_EQ(BlocksFor(1, 16), 1);
  EXPECT_EQ(BlocksFor(16, 16), 1);
  EXPECT_EQ(BlocksFor(17, 16), 2);
  EXPECT_EQ(BlocksFor(5, 1), 5);
}

TEST(BlockPoolDeathTest, DoubleFreeIsCaught) {
  BlockPool pool(2);
  const std::vector<int32_t> a = pool.Allocate(1);
  pool.Free(a);
  EXPECT_DEATH(pool.Free(a), "a block is not freed twice");
}

TEST(BlockPool, RandomizedOperationsKeepInvariants) {
  std::mt19937 rng(1234);
  BlockPool pool(37);
  std::vector<std::vector<int32_t>> held;
  for (int step = 0; step < 5000; ++step) {
    if (held.empty() || (rng() % 2 == 0)) {
      const int32_t n = static_cast<int32_t>(rng() % 6);
      if (pool.CanAllocate(n)) held.push_back(pool.Allocate(n));
    } else {
      const size_t i = rng() % held.size();
      pool.Free(held[i]);
      held.erase(held.begin() + i);
    }
    pool.CheckInvariants();
    int32_t in_use = 0;
    for (const auto& h : held) in_use += static_cast<int32_t>(h.size());
    ASSERT_EQ(pool.num_free() + in_use, pool.num_total()) << "step " << step;
  }
  for (const auto& h : held) pool.Free(h);
  EXPECT_EQ(pool.num_free(), 37);
}

}  // namespace
}  // namespace inferd

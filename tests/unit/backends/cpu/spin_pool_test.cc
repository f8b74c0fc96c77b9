// The cpu backend's thread team: every index of a loop runs exactly once, in parts of at least the grain, across
// many jobs back to back and after its workers have gone to sleep.
#include "engine/backends/cpu/spin_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace inferd {
namespace {

// Runs one loop of n and checks it: each index once, each part at least `grain` long (or the whole loop).
void CheckLoop(SpinPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> parts{0}, short_parts{0};
  pool.For(n, grain, [&](int64_t begin, int64_t end) {
    ++parts;
    if (end - begin < grain && end - begin < n) ++short_parts;
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  int wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += hits[i].load() != 1;
  EXPECT_EQ(wrong, 0) << "n " << n << ", grain " << grain;
  EXPECT_EQ(short_parts.load(), 0) << "n " << n << ", grain " << grain;
  EXPECT_LE(parts.load(), pool.threads());
  if (n >= grain * pool.threads()) {
    EXPECT_EQ(parts.load(), pool.threads()) << "n " << n;
  }
}

TEST(SpinPool, RunsEveryIndexOnceInPartsOfAtLeastTheGrain) {
  for (int threads : {1, 2, 3, 5}) {
    SpinPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 2, 100}) CheckLoop(pool, n, grain);
    }
  }
}

TEST(SpinPool, ManyJobsBackToBackEachSeeTheirOwnLoop) {
  SpinPool pool(3);
  for (int job = 0; job < 3000; ++job) {
    const int64_t n = 1 + job % 37;
    std::atomic<int64_t> sum{0};
    pool.For(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum += i + job;
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2 + n * job) << "job " << job;
  }
}

TEST(SpinPool, WakesWorkersThatWentToSleep) {
  SpinPool pool(3);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(SpinPool::kSpin * 4);  // past the spin: the workers sleep
    std::vector<std::thread::id> ids(3);
    pool.For(3, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ids[i] = std::this_thread::get_id();
    });
    EXPECT_NE(ids[0], ids[1]);
    EXPECT_NE(ids[1], ids[2]);
    EXPECT_NE(ids[0], ids[2]);
    EXPECT_EQ(ids[0], std::this_thread::get_id());  // the first part runs on the caller
  }
}

}  // namespace
}  // namespace inferd

// The threads that drive a tensor-parallel model's GPUs, without a GPU: every rank runs each job at once (a job
// that needs all ranks inside it together, as an NCCL collective does, finishes), rank 0 on the caller's thread,
// each other rank always on the same thread of its own, and the first failure by rank order comes back.
#include "engine/backends/cuda/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace inferd::cuda {
namespace {

TEST(RankThreads, EveryRankRunsEachJobAtOnceOnItsOwnThread) {
  for (int n : {1, 2, 4, 8}) {
    std::vector<std::thread::id> init_thread(n);
    RankThreads threads(n, [&](int r) { init_thread[r] = std::this_thread::get_id(); });
    std::barrier all_inside(n);  // deadlocks unless every rank is inside the job together
    for (int job = 0; job < 20; ++job) {
      std::vector<std::thread::id> ran_on(n);
      std::vector<int> ran(n, 0);
      ASSERT_TRUE(threads
                      .Run([&](int r) {
                        ran_on[r] = std::this_thread::get_id();
                        ++ran[r];
                        all_inside.arrive_and_wait();
                        return absl::OkStatus();
                      })
                      .ok());
      EXPECT_EQ(ran, std::vector<int>(n, 1)) << n << " ranks, job " << job;
      EXPECT_EQ(ran_on[0], std::this_thread::get_id()) << "rank 0 runs on the caller's thread";
      std::set<std::thread::id> distinct(ran_on.begin(), ran_on.end());
      EXPECT_EQ(static_cast<int>(distinct.size()), n);
      for (int r = 1; r < n; ++r) EXPECT_EQ(ran_on[r], init_thread[r]) << "rank " << r << " keeps its thread";
    }
  }
}

TEST(RankThreads, TheFirstFailureByRankComesBackAfterEveryRankFinished) {
  RankThreads threads(4, [](int) {});
  std::atomic<int> finished{0};
  const absl::Status st = threads.Run([&](int r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(r == 3 ? 50 : 0));
    ++finished;
    return r >= 2 ? absl::InternalError(absl::StrCat("rank ", r)) : absl::OkStatus();
  });
  EXPECT_EQ(finished.load(), 4);
  EXPECT_EQ(st.message(), "rank 2");
  // And the threads still serve the next job.
  EXPECT_TRUE(threads.Run([](int) { return absl::OkStatus(); }).ok());
}

}  // namespace
}  // namespace inferd::cuda

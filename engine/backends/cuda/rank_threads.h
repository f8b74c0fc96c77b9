// The threads of a tensor-parallel model's ranks, one per GPU: rank 0 runs on the calling thread (the engine's),
// every other rank on a thread of its own, made once with its device current. Run() hands the same job to every
// rank at once and returns when all are done: each rank enqueues its own copies, kernels, graphs and NCCL calls on
// its own stream, so NCCL sees every rank's call of a collective in flight together. With one rank, Run() is a
// plain call on the calling thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace inferd::cuda {

class RankThreads {
 public:
  // `init` runs first on each rank's own thread (rank >= 1): it makes the rank's device current.
  RankThreads(int num_ranks, const std::function<void(int rank)>& init);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return num_ranks_; }
  // Runs job(rank) for every rank at once; the first failure by rank order.
  absl::Status Run(const std::function<absl::Status(int rank)>& job);

 private:
  void Loop(int rank, std::function<void(int)> init);

  const int num_ranks_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<absl::Status(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // bumped per job
  int pending_ = 0;          // ranks >= 1 still running the job
  bool stop_ = false;
  std::vector<absl::Status> results_;
  std::vector<std::thread> threads_;
};

}  // namespace inferd::cuda

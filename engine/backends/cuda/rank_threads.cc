#include "engine/backends/cuda/rank_threads.h"

namespace inferd::cuda {

RankThreads::RankThreads(int num_ranks, const std::function<void(int rank)>& init)
    : num_ranks_(num_ranks), results_(num_ranks) {
  for (int r = 1; r < num_ranks; ++r) threads_.emplace_back(&RankThreads::Loop, this, r, init);
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::Loop(int rank, std::function<void(int)> init) {
  init(rank);
  uint64_t seen = 0;
  while (true) {
    const std::function<absl::Status(int)>* job = nullptr;
    {
      std::unique_lock lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    absl::Status result = (*job)(rank);
    {
      std::lock_guard lock(mu_);
      results_[rank] = std::move(result);
      --pending_;
    }
    done_.notify_one();
  }
}

absl::Status RankThreads::Run(const std::function<absl::Status(int rank)>& job) {
  if (num_ranks_ == 1) return job(0);
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    pending_ = num_ranks_ - 1;
    ++generation_;
  }
  start_.notify_all();
  results_[0] = job(0);
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  for (const absl::Status& st : results_) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace inferd::cuda

#include "server/request_workers.h"

namespace inferd {

RequestWorkers::RequestWorkers(int num_threads, int max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Work(); });
}

RequestWorkers::~RequestWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool RequestWorkers::TryRun(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || static_cast<int>(jobs_.size()) >= max_queued_) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void RequestWorkers::Work() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace inferd

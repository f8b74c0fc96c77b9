// A bounded pool of threads for the server's CPU work, so neither gRPC's callback threads nor the engine's
// thread run it: one pool prepares requests before they reach the engine (parsing, chat rendering, tokenizing),
// so health and info RPCs stay answerable whatever the requests hold; another builds and writes the outputs
// the engine hands over (protobuf encoding, starting the writes), so the GPU does not wait on them.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace inferd {

class RequestWorkers {
 public:
  RequestWorkers(int num_threads, int max_queued);
  ~RequestWorkers();  // runs what is queued, then joins
  RequestWorkers(const RequestWorkers&) = delete;
  RequestWorkers& operator=(const RequestWorkers&) = delete;

  // Queues a job; false (and the job is not run) when max_queued jobs already wait.
  [[nodiscard]] bool TryRun(std::function<void()> job);

 private:
  void Work();

  const int max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace inferd

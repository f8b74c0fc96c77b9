// An OutputSink that keeps every token, logprob and the finish of one request, for tests.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/time/time.h"
#include "engine/request.h"

namespace inferd::testing {

class CollectingSink : public OutputSink {
 public:
  void Push(RequestOutput out) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t t : out.token_ids) tokens.push_back(t);
    for (auto& lp : out.logprobs) logprobs.push_back(lp);
    for (auto& lp : out.prompt_logprobs) prompt_logprobs.push_back(lp);
    if (out.finish != FinishReason::kNone || !out.error.ok()) {
      finish = out.finish;
      error = out.error;
      usage = out.usage;
      done = true;
      cv_.notify_all();
    }
  }
  size_t num_tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens.size();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done; });
  }
  bool WaitFor(absl::Duration d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(d), [&] { return done; });
  }
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
  Usage usage;
  bool done = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace inferd::testing

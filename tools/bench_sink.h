// The engine-side benchmarks' request sink (inferd-bench's offline sections, `inferd-bench speculative`): each
// token's id, host arrival time and logprobs, and the request's end; plus submitting and waiting that end the
// benchmark on an error.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "engine/engine.h"

namespace inferd {

class BenchSink : public OutputSink {
 public:
  void Push(RequestOutput out) override {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    for (int32_t t : out.token_ids) {
      tokens.push_back(t);
      times.push_back(now);
    }
    for (TokenLogprob& lp : out.logprobs) logprobs.push_back(std::move(lp));
    if (out.finish != FinishReason::kNone || !out.error.ok()) {
      error = out.error;
      done = true;
      cv_.notify_all();
    }
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done; });
  }
  std::vector<int32_t> tokens;
  std::vector<absl::Time> times;
  std::vector<TokenLogprob> logprobs;
  absl::Status error;
  bool done = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// Submits `r` with a new sink, which it returns; exits the benchmark if the engine refuses it.
inline std::shared_ptr<BenchSink> SubmitOrExit(Engine& engine, Request r) {
  auto sink = std::make_shared<BenchSink>();
  r.sink = sink;
  if (auto s = engine.Submit(std::move(r)); !s.ok()) {
    std::fprintf(stderr, "submit: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return sink;
}

// Waits for the request's end; exits the benchmark if it failed.
inline void WaitOk(BenchSink& sink) {
  sink.Wait();
  if (!sink.error.ok()) {
    std::fprintf(stderr, "request failed: %s\n", sink.error.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace inferd

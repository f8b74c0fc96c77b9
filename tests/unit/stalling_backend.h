// A backend whose steps can be held: while Control::stalled, Step blocks until released (a long or stuck step), and
// Progress() reports what the test sets (a held step that still advances). Steps return token 100.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>

#include "engine/runtime/backend.h"

namespace inferd::testing {

class StallingBackend : public Backend {
 public:
  struct Control {
    std::mutex mu;
    std::condition_variable cv;
    bool stalled = false;
    int stuck_steps = 0;                // steps now blocked
    std::atomic<uint64_t> progress{0};  // what Progress() reports: a blocked step that still advances
  };
  explicit StallingBackend(Control* c) : c_(c) {}
  std::string name() const override { return "stalling"; }
  uint64_t Progress() const override { return c_->progress.load(); }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits&) override {
    MemoryPlan p;
    p.device = "stalling";
    p.kv_bytes_per_block = 1024;
    return p;
  }
  absl::Status AllocateKvCache(const MemoryPlan&) override { return absl::OkStatus(); }
  absl::Status AllocateHostBlocks(int32_t) override { return absl::OkStatus(); }
  absl::Status StartCopies(const CopyBatch& batch) override {
    completed_copies_ = batch.ticket;
    return absl::OkStatus();
  }
  uint64_t CompletedCopies() override { return completed_copies_; }
  absl::Status WaitForCopies(uint64_t) override { return absl::OkStatus(); }
  uint64_t completed_copies_ = 0;
  absl::Status Step(const StepInput& in, StepOutput* out) override {
    std::unique_lock<std::mutex> lock(c_->mu);
    ++c_->stuck_steps;
    c_->cv.notify_all();
    c_->cv.wait(lock, [&] { return !c_->stalled; });
    --c_->stuck_steps;
    out->tokens.assign(in.num_logits(), 100);
    out->logprobs.assign(in.num_logits(), {});
    return absl::OkStatus();
  }

 private:
  Control* c_;
};

}  // namespace inferd::testing

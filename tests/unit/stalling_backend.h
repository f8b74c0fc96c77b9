// A backend whose steps can be held: while Control::stalled, Step blocks until released (a long or stuck step), and
// Progress() reports what the test sets (a held step that still advances). Steps return token 100.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "engine/runtime/backend.h"
#include "tests/unit/host_only_backend.h"

namespace inferd::testing {

class StallingBackend : public HostOnlyBackend {
 public:
  struct Control {
    std::mutex mu;
    std::condition_variable cv;
    bool stalled = false;
    int stuck_steps = 0;                // steps now blocked
    std::atomic<uint64_t> progress{0};  // what Progress() reports: a blocked step that still advances

    // Steps from now on block (true) or run (false; the blocked ones return).
    void Hold(bool hold) {
      {
        std::lock_guard<std::mutex> lock(mu);
        stalled = hold;
      }
      cv.notify_all();
    }
    // Waits up to 10 s for a step to be blocked.
    bool WaitForStuckStep() {
      std::unique_lock<std::mutex> lock(mu);
      return cv.wait_for(lock, std::chrono::seconds(10), [&] { return stuck_steps == 1; });
    }
  };
  explicit StallingBackend(Control* c) : HostOnlyBackend("stalling"), c_(c) {}
  uint64_t Progress() const override { return c_->progress.load(); }
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

// An engine over a StallingBackend controlled by `control`.
inline absl::StatusOr<std::shared_ptr<Engine>> StallingEngine(const Config& config, StallingBackend::Control* control) {
  auto engine =
      Engine::Create(config, [control](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
        return std::make_unique<StallingBackend>(control);
      });
  if (!engine.ok()) return engine.status();
  return std::shared_ptr<Engine>(*std::move(engine));
}

}  // namespace inferd::testing

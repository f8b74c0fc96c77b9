// Health that means progress, against a backend made to stall: a step that does not return while a request
// is pending turns health NOT_SERVING after server.liveness_timeout_s, and SERVING again once steps resume.
// An idle engine (nothing pending) is never reported as stalled.
#include "server/liveness.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

// Steps return token 100 at once, except while stalled: then Step blocks until released.
class StallingBackend : public Backend {
 public:
  struct Control {
    std::mutex mu;
    std::condition_variable cv;
    bool stalled = false;
    int stuck_steps = 0;  // steps now blocked
  };
  explicit StallingBackend(Control* c) : c_(c) {}
  std::string name() const override { return "stalling"; }
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

class Flips {
 public:
  void Record(bool serving) {
    std::lock_guard<std::mutex> lock(mu_);
    flips_.push_back(serving);
    cv_.notify_all();
  }
  // Waits up to `seconds` for the n-th flip.
  bool WaitFor(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return flips_.size() >= n; });
  }
  std::vector<bool> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return flips_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> flips_;
};

TEST(Liveness, AStalledStepFlipsHealthToNotServingAndBack) {
  StallingBackend::Control control;
  Config config;
  config.model.path = testing::ModelDir("llama2-tiny");
  config.engine.num_blocks = 16;
  config.engine.block_size = 4;
  auto engine = Engine::Create(config, [&](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::make_unique<StallingBackend>(&control);
  });
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::shared_ptr<Engine> e = std::move(*engine);
  Flips flips;
  Liveness liveness(e, 0.2, [&](bool serving) { flips.Record(serving); });

  // Idle for longer than the timeout: nothing is pending, so nothing flips.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(flips.Get().empty());

  {
    std::lock_guard<std::mutex> lock(control.mu);
    control.stalled = true;
  }
  auto sink = std::make_shared<testing::CollectingSink>();
  Request r;
  r.id = "stuck";
  r.prompt = {1, 2, 3};
  r.stopping.max_tokens = 4;
  r.stopping.ignore_eos = true;
  r.sink = sink;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  {
    std::unique_lock<std::mutex> lock(control.mu);
    ASSERT_TRUE(control.cv.wait_for(lock, std::chrono::seconds(10), [&] { return control.stuck_steps == 1; }));
  }
  ASSERT_TRUE(flips.WaitFor(1, 10)) << "no flip while a step stalled";
  EXPECT_EQ(flips.Get(), std::vector<bool>{false});

  {
    std::lock_guard<std::mutex> lock(control.mu);
    control.stalled = false;
  }
  control.cv.notify_all();
  ASSERT_TRUE(flips.WaitFor(2, 10)) << "no flip back once steps resumed";
  EXPECT_EQ(flips.Get(), (std::vector<bool>{false, true}));
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(sink->error.ok()) << sink->error;
  EXPECT_EQ(sink->tokens.size(), 4u);
  liveness.Stop();
  e->Stop();
}

}  // namespace
}  // namespace inferd

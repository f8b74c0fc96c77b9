// The engine's step loop with a fake backend: what reaches the backend, and what a client sees when a step
// fails or a deadline passes while the request runs. Blocks are back in the pool in every case.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/runtime/philox.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

using testing::CollectingSink;

// Samples token (position % 50) + 100; fails the step when asked to; can be slowed down.
class FakeBackend : public Backend {
 public:
  struct Control {
    std::atomic<bool> fail{false};
    std::atomic<int> step_ms{0};
    std::atomic<int> steps{0};
    std::atomic<int> bad_rows{0};  // steps whose sampling rows did not match their logits rows
  };
  explicit FakeBackend(Control* c) : c_(c) {}
  std::string name() const override { return "fake"; }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) override {
    MemoryPlan p;
    p.device = "fake";
    p.kv_bytes_per_block = 1024;
    return p;
  }
  absl::Status AllocateKvCache(const MemoryPlan& plan) override { return absl::OkStatus(); }
  absl::Status Step(const StepInput& in, StepOutput* out) override {
    c_->steps++;
    if (c_->step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(c_->step_ms.load()));
    if (c_->fail) return absl::InternalError("fake device fault");
    if (in.sampling.size() != in.logits_indices.size()) c_->bad_rows++;
    out->tokens.clear();
    out->logprobs.assign(in.num_logits(), {});
    for (int32_t r = 0; r < in.num_logits(); ++r) {
      const SamplingRow& row = in.sampling[r];
      if (row.position != in.positions[in.logits_indices[r]] + 1) c_->bad_rows++;
      if (row.params.seed && row.uniform != SamplingUniform(*row.params.seed, row.position)) c_->bad_rows++;
      out->tokens.push_back(100 + row.position % 50);
    }
    return absl::OkStatus();
  }

 private:
  Control* c_;
};

class EngineWithFakeBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config;
    config.model.path = testing::ModelDir("llama2-tiny");
    config.engine.num_blocks = 64;
    config.engine.block_size = 4;
    auto e = Engine::Create(config, [this](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return std::make_unique<FakeBackend>(&control_);
    });
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }

  std::shared_ptr<CollectingSink> Submit(const std::string& id, int32_t max_tokens,
                                         absl::Time deadline = absl::InfiniteFuture()) {
    Request r;
    r.id = id;
    r.prompt = {1, 2, 3, 4, 5, 6};
    r.sampling.seed = 42;
    r.stopping.max_tokens = max_tokens;
    r.stopping.ignore_eos = true;
    r.deadline = deadline;
    auto sink = std::make_shared<CollectingSink>();
    r.sink = sink;
    EXPECT_TRUE(engine_->Submit(std::move(r)).ok());
    return sink;
  }

  FakeBackend::Control control_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineWithFakeBackend, TokensComeFromTheBackendWithSamplingRowsForEveryLogitsRow) {
  auto sink = Submit("a", 5);
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(sink->finish, FinishReason::kLength);
  EXPECT_EQ(sink->tokens, (std::vector<int32_t>{106, 107, 108, 109, 110}));
  EXPECT_EQ(control_.bad_rows, 0);
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
}

TEST_F(EngineWithFakeBackend, AFailedStepEndsItsRequestsWithTheErrorAndFreesTheirBlocks) {
  control_.fail = true;
  auto sink = Submit("a", 5);
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(sink->finish, FinishReason::kAborted);
  EXPECT_EQ(sink->error.code(), absl::StatusCode::kInternal);
  EXPECT_NE(sink->error.message().find("fake device fault"), std::string::npos);
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
  // The engine goes on serving once the device recovers.
  control_.fail = false;
  auto next = Submit("b", 3);
  ASSERT_TRUE(next->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(next->finish, FinishReason::kLength);
  EXPECT_EQ(next->tokens.size(), 3u);
}

TEST_F(EngineWithFakeBackend, ADeadlinePassingWhileRunningEndsTheRequestAndFreesItsBlocks) {
  control_.step_ms = 20;
  auto sink = Submit("a", 1000, absl::Now() + absl::Milliseconds(200));
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(sink->error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GT(sink->tokens.size(), 0u) << "it ran before the deadline passed";
  EXPECT_LT(sink->tokens.size(), 1000u);
  const int steps = control_.steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(control_.steps, steps) << "no step runs for a finished request";
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
}

}  // namespace
}  // namespace inferd

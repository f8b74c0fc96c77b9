// Health that means progress, against a backend made to stall: a step that does not return while a request
// is pending turns health NOT_SERVING after server.liveness_timeout_s, and SERVING again once steps resume.
// An idle engine (nothing pending) is never reported as stalled.
#include "server/liveness.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/stalling_backend.h"

namespace inferd {
namespace {

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
  testing::StallingBackend::Control control;
  Config config;
  config.model.path = testing::ModelDir("llama2-tiny");
  config.engine.num_blocks = 16;
  config.engine.block_size = 4;
  auto engine = testing::StallingEngine(config, &control);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::shared_ptr<Engine> e = *engine;
  Flips flips;
  Liveness liveness(e, 0.2, [&](bool serving) { flips.Record(serving); });

  // Idle for longer than the timeout: nothing is pending, so nothing flips.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(flips.Get().empty());

  control.Hold(true);
  auto sink = std::make_shared<testing::CollectingSink>();
  Request r;
  r.id = "stuck";
  r.prompt = {1, 2, 3};
  r.stopping.max_tokens = 4;
  r.stopping.ignore_eos = true;
  r.sink = sink;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(control.WaitForStuckStep());
  ASSERT_TRUE(flips.WaitFor(1, 10)) << "no flip while a step stalled";
  EXPECT_EQ(flips.Get(), std::vector<bool>{false});

  control.Hold(false);
  ASSERT_TRUE(flips.WaitFor(2, 10)) << "no flip back once steps resumed";
  EXPECT_EQ(flips.Get(), (std::vector<bool>{false, true}));
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(sink->error.ok()) << sink->error;
  EXPECT_EQ(sink->tokens.size(), 4u);
  liveness.Stop();
  e->Stop();
}

// A step that takes far longer than the timeout but advances inside (a long cpu prefill, layer by layer) is busy,
// not stuck: health stays SERVING while it moves, and turns NOT_SERVING once it stops moving.
TEST(Liveness, ALongStepThatAdvancesIsNotAStall) {
  testing::StallingBackend::Control control;
  Config config;
  config.model.path = testing::ModelDir("llama2-tiny");
  config.engine.num_blocks = 16;
  config.engine.block_size = 4;
  auto engine = testing::StallingEngine(config, &control);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::shared_ptr<Engine> e = *engine;
  Flips flips;
  Liveness liveness(e, 1.0, [&](bool serving) { flips.Record(serving); });
  control.Hold(true);
  auto sink = std::make_shared<testing::CollectingSink>();
  Request r;
  r.id = "long";
  r.prompt = {1, 2, 3};
  r.stopping.max_tokens = 2;
  r.stopping.ignore_eos = true;
  r.sink = sink;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(control.WaitForStuckStep());
  // The step advances every 20 ms for three timeouts' worth of time: no flip.
  for (int i = 0; i < 150; ++i) {
    ++control.progress;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(flips.Get().empty()) << "a long step that advanced was reported as a stall";
  // Then it stops advancing: a stall.
  ASSERT_TRUE(flips.WaitFor(1, 10)) << "no flip once the step stopped advancing";
  EXPECT_EQ(flips.Get(), std::vector<bool>{false});
  control.Hold(false);
  ASSERT_TRUE(flips.WaitFor(2, 10));
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(sink->error.ok()) << sink->error;
  liveness.Stop();
  e->Stop();
}

}  // namespace
}  // namespace inferd

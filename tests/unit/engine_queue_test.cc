// Queue seats (scheduler.max_queue, max_queued_tokens) are released the moment a waiting request is cancelled, not
// at the next step boundary: with the engine held inside a long step, cancelled requests let new ones in at once.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/stalling_backend.h"

namespace inferd {
namespace {

Request Make(const std::string& id, std::shared_ptr<OutputSink> sink) {
  Request r;
  r.id = id;
  r.prompt = {1, 2, 3, 4};
  r.stopping.max_tokens = 2;
  r.stopping.ignore_eos = true;
  r.sink = std::move(sink);
  return r;
}

TEST(EngineQueue, ACancelledWaitingRequestFreesItsSeatWhileAStepIsStillRunning) {
  testing::StallingBackend::Control control;
  Config config;
  config.model.path = testing::ModelDir("llama2-tiny");
  config.engine.num_blocks = 64;
  config.engine.block_size = 4;
  config.scheduler.max_num_seqs = 1;
  config.scheduler.max_queue = 4;
  config.scheduler.max_queued_tokens = 16;  // exactly four prompts of four tokens
  auto engine = testing::StallingEngine(config, &control);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::shared_ptr<Engine> e = *engine;
  control.Hold(true);
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  auto submit = [&](const std::string& id) {
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    return e->Submit(Make(id, sinks.back()));
  };
  ASSERT_TRUE(submit("running").ok());
  // It is inside the held step: started, so it holds no seat.
  ASSERT_TRUE(control.WaitForStuckStep());
  std::vector<RequestHandle> waiting;
  for (int i = 0; i < 4; ++i) {
    auto h = submit("waiting" + std::to_string(i));
    ASSERT_TRUE(h.ok()) << h.status();
    waiting.push_back(*h);
  }
  auto full = submit("one too many");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();

  // The step is still held: nothing reaches a step boundary. Cancels (and an Abort by id) free the seats now.
  for (int i = 0; i < 3; ++i) e->Cancel(waiting[i]);
  EXPECT_TRUE(e->Abort("waiting3"));
  e->Cancel(waiting[0]);  // twice: nothing more is released
  for (int i = 0; i < 4; ++i) {
    auto h = submit("after" + std::to_string(i));
    EXPECT_TRUE(h.ok()) << "seat " << i << " still held by a cancelled request: " << h.status();
  }
  auto again_full = submit("still bounded");
  EXPECT_EQ(again_full.status().code(), absl::StatusCode::kResourceExhausted) << again_full.status();
  {
    std::lock_guard<std::mutex> lock(control.mu);
    EXPECT_EQ(control.stuck_steps, 1) << "the test needs the step held throughout";
  }
  control.Hold(false);
  // Every accepted request ends: the cancelled ones aborted, the rest generated.
  for (size_t i = 0; i < sinks.size(); ++i) {
    if (i == 5 || i == 10) continue;  // the two refused
    ASSERT_TRUE(sinks[i]->WaitFor(absl::Seconds(30))) << "request " << i << " never ended";
  }
  for (int i = 1; i <= 4; ++i) EXPECT_EQ(sinks[i]->finish, FinishReason::kAborted) << i;
  for (int i = 6; i <= 9; ++i) EXPECT_EQ(sinks[i]->tokens.size(), 2u) << i;
  e->Stop();
}

}  // namespace
}  // namespace inferd

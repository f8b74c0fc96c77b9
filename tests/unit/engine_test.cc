// The engine's step loop with a fake backend: what reaches the backend, and what a client sees when a step
// fails or a deadline passes while the request runs. Blocks are back in the pool in every case. Every test
// runs with each step planned after the last one's tokens are in and with steps planned ahead
// (engine.plan_ahead), where the fake backend reads pending tokens through Backend's default Launch.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/runtime/philox.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/host_only_backend.h"

namespace inferd {
namespace {

using testing::CollectingSink;

// Samples token 100 + (position + seed) % 50 (seed: the request's, or 0); fails the step when asked to; can
// be slowed down. Every token fed back past the 6-token prompts must be the one it sampled for that sequence.
class FakeBackend : public testing::HostOnlyBackend {
 public:
  struct Control {
    std::atomic<bool> fail{false};
    std::atomic<int> step_ms{0};
    std::atomic<int> steps{0};
    std::atomic<int> bad_rows{0};    // steps whose sampling rows did not match their logits rows
    std::atomic<int> bad_tokens{0};  // output tokens fed back other than as sampled
  };
  explicit FakeBackend(Control* c) : HostOnlyBackend("fake"), c_(c) {}
  absl::Status Step(const StepInput& in, StepOutput* out) override {
    c_->steps++;
    if (c_->step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(c_->step_ms.load()));
    if (c_->fail) return absl::InternalError("fake device fault");
    if (in.sampling.size() != in.logits_indices.size()) c_->bad_rows++;
    for (int32_t r = 0; r < in.num_logits(); ++r) {
      const int32_t t = in.logits_indices[r], p = in.positions[t];
      if (p >= 6 && in.token_ids[t] != Token(p, in.sampling[r].params)) c_->bad_tokens++;
    }
    out->tokens.clear();
    out->logprobs.assign(in.num_logits(), {});
    for (int32_t r = 0; r < in.num_logits(); ++r) {
      const SamplingRow& row = in.sampling[r];
      if (row.position != in.positions[in.logits_indices[r]] + 1) c_->bad_rows++;
      if (row.params.seed && row.uniform != SamplingUniform(*row.params.seed, row.position)) c_->bad_rows++;
      out->tokens.push_back(Token(row.position, row.params));
    }
    return absl::OkStatus();
  }

 private:
  static int32_t Token(int32_t position, const SamplingParams& p) {
    return 100 + static_cast<int32_t>((position + p.seed.value_or(0)) % 50);
  }
  Control* c_;
};

// The parameter is engine.plan_ahead.
class EngineWithFakeBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { Start(/*max_num_seqs=*/64, /*max_queue=*/256); }

  void Start(int32_t max_num_seqs, int32_t max_queue) {
    engine_.reset();
    Config config;
    config.model.path = testing::ModelDir("llama2-tiny");
    config.engine.num_blocks = 64;
    config.engine.block_size = 4;
    config.scheduler.max_num_seqs = max_num_seqs;
    config.scheduler.max_queue = max_queue;
    config.engine.plan_ahead = GetParam();
    auto e = Engine::Create(config, [this](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return std::make_unique<FakeBackend>(&control_);
    });
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }

  absl::StatusOr<RequestHandle> TrySubmit(const std::string& id, int32_t max_tokens,
                                          std::shared_ptr<CollectingSink> sink) {
    Request r;
    r.id = id;
    r.prompt = {1, 2, 3, 4, 5, 6};
    r.stopping.max_tokens = max_tokens;
    r.stopping.ignore_eos = true;
    r.sink = sink;
    return engine_->Submit(std::move(r));
  }

  std::shared_ptr<CollectingSink> Submit(const std::string& id, int32_t max_tokens,
                                         absl::Time deadline = absl::InfiniteFuture(),
                                         std::vector<int32_t> stop_token_ids = {}, uint64_t seed = 42) {
    Request r;
    r.id = id;
    r.prompt = {1, 2, 3, 4, 5, 6};
    r.sampling.seed = seed;
    r.stopping.max_tokens = max_tokens;
    r.stopping.ignore_eos = true;
    r.stopping.stop_token_ids = std::move(stop_token_ids);
    r.deadline = deadline;
    auto sink = std::make_shared<CollectingSink>();
    r.sink = sink;
    EXPECT_TRUE(engine_->Submit(std::move(r)).ok());
    return sink;
  }

  FakeBackend::Control control_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(EngineWithFakeBackend, TokensComeFromTheBackendWithSamplingRowsForEveryLogitsRow) {
  const int warm_up_steps = control_.steps;
  auto sink = Submit("a", 5);
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(sink->finish, FinishReason::kLength);
  EXPECT_EQ(sink->tokens, (std::vector<int32_t>{148, 149, 100, 101, 102}));
  EXPECT_EQ(sink->usage.completion_tokens, 5);
  EXPECT_EQ(control_.bad_rows, 0);
  EXPECT_EQ(control_.bad_tokens, 0);
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
  EXPECT_EQ(control_.steps - warm_up_steps, 5) << "a request's last allowed token is not fed to another step";
}

// Planned ahead, the step after a stop token's is already running when the host sees it: that row's token
// is dropped, the usage counts what the client got, and every block comes back. Seed i stops at its
// (4 - i)-th token for i < 4 and runs to max_tokens for the others.
TEST_P(EngineWithFakeBackend, AStopTokenEndsTheRequestAtItsTokenWhateverRanBehindIt) {
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(Submit("s" + std::to_string(i), 20, absl::InfiniteFuture(), {109}, /*seed=*/i));
  }
  for (int i = 0; i < 8; ++i) {
    CollectingSink& sink = *sinks[i];
    ASSERT_TRUE(sink.WaitFor(absl::Seconds(10)));
    std::vector<int32_t> want;
    for (int32_t p = 6; want.size() < 20 && (want.empty() || want.back() != 109); ++p)
      want.push_back(100 + (p + i) % 50);
    EXPECT_EQ(sink.finish, i < 4 ? FinishReason::kStopToken : FinishReason::kLength) << i;
    EXPECT_EQ(sink.tokens, want) << i;
    EXPECT_EQ(sink.usage.completion_tokens, static_cast<int32_t>(want.size())) << i;
  }
  EXPECT_EQ(control_.bad_tokens, 0);
  EXPECT_EQ(control_.bad_rows, 0);
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
}

// The server matches stop strings in the text and tells the engine how many tokens the request ends with; the
// tokens generated meanwhile are not counted, the blocks come back and the id is free once the last output is out.
TEST_P(EngineWithFakeBackend, StopAtEndsTheRequestAfterTheGivenTokens) {
  control_.step_ms = 5;
  auto sink = std::make_shared<CollectingSink>();
  auto handle = TrySubmit("a", 1000, sink);
  ASSERT_TRUE(handle.ok()) << handle.status();
  while (sink->num_tokens() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine_->StopAt(*handle, 3);
  ASSERT_TRUE(sink->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(sink->finish, FinishReason::kStopString);
  EXPECT_TRUE(sink->error.ok()) << sink->error;
  EXPECT_EQ(sink->usage.completion_tokens, 3);
  EXPECT_GE(sink->tokens.size(), 5u) << "what the engine sent before it took the stop";
  EXPECT_LT(sink->tokens.size(), 1000u);
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
  EXPECT_EQ(engine_->Stats().unfinished, 0);
  engine_->StopAt(*handle, 1);  // finished already: ignored
  EXPECT_TRUE(TrySubmit("a", 2, std::make_shared<CollectingSink>()).ok()) << "the id is free again";
  EXPECT_EQ(control_.bad_tokens, 0);
}

TEST_P(EngineWithFakeBackend, AFailedStepEndsItsRequestsWithTheErrorAndFreesTheirBlocks) {
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

TEST_P(EngineWithFakeBackend, ADeadlinePassingWhileRunningEndsTheRequestAndFreesItsBlocks) {
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

// A drain waits on `unfinished`: it counts a request from Submit to its last output, also in the moments when it
// is neither running nor waiting in the last published step counts (taken from the queue, mid-step).
TEST_P(EngineWithFakeBackend, UnfinishedCountsARequestFromSubmitToItsLastOutput) {
  control_.step_ms = 25;
  EXPECT_EQ(engine_->Stats().unfinished, 0);
  auto sink = Submit("a", 40);
  EXPECT_EQ(engine_->Stats().unfinished, 1);
  int observations = 0;
  while (!sink->WaitFor(absl::Microseconds(200))) {
    ++observations;
    if (engine_->Stats().unfinished == 0) {
      ASSERT_TRUE(sink->WaitFor(absl::Milliseconds(100))) << "unfinished read 0 while the request had tokens to go";
    }
  }
  EXPECT_GT(observations, 100);
  EXPECT_EQ(sink->tokens.size(), 40u);
  EXPECT_EQ(engine_->Stats().unfinished, 0);
}

TEST_P(EngineWithFakeBackend, ALateCancelOfAFinishedRequestNeverTouchesANewOneWithItsId) {
  auto first = std::make_shared<CollectingSink>();
  auto a = TrySubmit("same-id", 2, first);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(first->WaitFor(absl::Seconds(10)));
  control_.step_ms = 5;
  auto second = std::make_shared<CollectingSink>();
  auto b = TrySubmit("same-id", 50, second);
  ASSERT_TRUE(b.ok()) << "a finished request's id may be used again";
  EXPECT_NE(*a, *b);
  engine_->Cancel(*a);  // the first RPC's cancellation arrives late
  ASSERT_TRUE(second->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(second->finish, FinishReason::kLength) << "the new request ran to its end";
  EXPECT_EQ(second->tokens.size(), 50u);
  // Cancel and the public Abort by id both reach the live request.
  auto third = std::make_shared<CollectingSink>();
  auto c = TrySubmit("same-id", 1000, third);
  ASSERT_TRUE(c.ok());
  engine_->Cancel(*c);
  ASSERT_TRUE(third->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(third->finish, FinishReason::kAborted);
  auto fourth = std::make_shared<CollectingSink>();
  ASSERT_TRUE(TrySubmit("other-id", 1000, fourth).ok());
  EXPECT_TRUE(engine_->Abort("other-id"));
  ASSERT_TRUE(fourth->WaitFor(absl::Seconds(10)));
  EXPECT_EQ(fourth->finish, FinishReason::kAborted);
  EXPECT_FALSE(engine_->Abort("other-id")) << "nothing live has that id any more";
  EXPECT_EQ(engine_->Stats().free_blocks, 64);
}

// Whoever submits, a sequence never outgrows max_model_len (256 here: 64 blocks of 4): a prompt that reaches it is
// refused naming it, and a request asking for more tokens than fit ends with kLength at max_model_len.
TEST_P(EngineWithFakeBackend, ASequenceNeverOutgrowsMaxModelLen) {
  ASSERT_EQ(engine_->max_model_len(), 256);
  Request r;
  r.id = "long";
  r.prompt.assign(256, 7);
  r.sink = std::make_shared<CollectingSink>();
  const auto refused = engine_->Submit(std::move(r));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("max_model_len = 256"), std::string::npos) << refused.status();
  auto sink = Submit("grows", 1000);
  sink->Wait();
  EXPECT_EQ(sink->finish, FinishReason::kLength);
  EXPECT_EQ(sink->tokens.size(), 256u - 6) << "the 6-token prompt and its output fill max_model_len exactly";
}

TEST_P(EngineWithFakeBackend, TheQueueBoundHoldsExactly) {
  Start(/*max_num_seqs=*/1, /*max_queue=*/2);
  control_.step_ms = 5;
  auto running = std::make_shared<CollectingSink>();
  ASSERT_TRUE(TrySubmit("running", 1000, running).ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (engine_->Stats().running != 1) {  // until it holds the only seat
    ASSERT_LT(absl::Now(), give_up) << "the first request never started";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // From many threads at once: exactly max_queue more are accepted, every other one is refused.
  std::atomic<int> accepted{0}, refused{0};
  std::vector<std::shared_ptr<CollectingSink>> sinks(32);
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    sinks[i] = std::make_shared<CollectingSink>();
    threads.emplace_back([&, i] {
      auto h = TrySubmit("q" + std::to_string(i), 1, sinks[i]);
      if (h.ok()) {
        ++accepted;
      } else if (h.status().code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(refused, 30);
  engine_->Abort("running");
  ASSERT_TRUE(running->WaitFor(absl::Seconds(10)));
}

INSTANTIATE_TEST_SUITE_P(PlanAhead, EngineWithFakeBackend, ::testing::Values("off", "on"));

// A mixture of experts' steps are costed with the experts the backend counted (StepOutput::experts_touched), -1 being
// random routing's expectation: the records of one request's steps, a 6-token prompt then 1-token decodes.
std::vector<StepRecord> MixtureSteps(int64_t experts_touched) {
  class CountingBackend : public testing::HostOnlyBackend {
   public:
    explicit CountingBackend(int64_t touched) : HostOnlyBackend("counting"), touched_(touched) {}
    absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) override {
      auto plan = HostOnlyBackend::MeasureMemory(limits);
      plan->weight_bytes = int64_t{1} << 20;  // bytes to count the weights at
      return plan;
    }
    absl::Status Step(const StepInput& in, StepOutput* out) override {
      out->tokens.assign(in.num_logits(), 100);
      out->logprobs.assign(in.num_logits(), {});
      out->experts_touched = touched_;
      return absl::OkStatus();
    }

   private:
    int64_t touched_;
  };
  Config config;
  config.model.path = testing::ModelDir("mixtral-tiny");
  config.engine.num_blocks = 16;
  config.engine.block_size = 4;
  auto engine = Engine::Create(config, [&](const Config&, const Model&) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::make_unique<CountingBackend>(experts_touched);
  });
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::mutex mu;
  std::vector<StepRecord> steps;
  (*engine)->SetObservers(nullptr, [&](const StepRecord& s) {
    std::lock_guard<std::mutex> lock(mu);
    steps.push_back(s);
  });
  Request r;
  r.id = "moe";
  r.prompt = {1, 2, 3, 4, 5, 6};
  r.stopping.max_tokens = 3;
  r.stopping.ignore_eos = true;
  auto sink = std::make_shared<CollectingSink>();
  r.sink = sink;
  EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  sink->Wait();
  engine->reset();  // the loop has stopped: no step is recorded past here
  return steps;
}

TEST(EngineStepCost, AMixtureOfExpertsStepIsCostedWithTheExpertsTheBackendCounted) {
  auto model = LoadModel(testing::ModelDir("mixtral-tiny"));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config;
  const int64_t one_row = int64_t{c.experts_per_token} * c.num_sparse_layers();  // k distinct experts a layer
  const std::vector<StepRecord> expected = MixtureSteps(-1), counted = MixtureSteps(one_row), none = MixtureSteps(0);
  ASSERT_EQ(expected.size(), 3u) << "a prefill step and two decode steps";
  ASSERT_EQ(counted.size(), expected.size());
  ASSERT_EQ(none.size(), expected.size());
  for (size_t i = 1; i < expected.size(); ++i) {  // one row touches exactly what random routing expects of it
    EXPECT_DOUBLE_EQ(counted[i].cost.bytes, expected[i].cost.bytes) << "step " << i;
  }
  // 6 rows are expected to touch more than one row's experts; the count given is what is costed.
  EXPECT_LT(counted[0].cost.bytes, expected[0].cost.bytes);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_LT(none[i].cost.bytes, counted[i].cost.bytes) << "step " << i;
    EXPECT_DOUBLE_EQ(none[i].cost.flops, expected[i].cost.flops) << "every token multiplies k experts either way";
  }
}

}  // namespace
}  // namespace inferd

// Prompt logprobs through the real engine and the cpu backend, teacher-forced against transformers: each
// reference case's prompt followed by its greedy tokens is sent as one prompt, and the logprobs of those tokens
// (and the top alternatives at each) must be the ones transformers computed step by step
// (tools/make_reference_fixtures.py). Few prompt rows per step (max_num_seqs 3) spread each prompt over many
// steps; prefix caching is on, and every prompt is sent twice at once.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

using testing::CollectingSink;

class PromptLogprobs : public ::testing::TestWithParam<const char*> {};

TEST_P(PromptLogprobs, EqualTransformersTeacherForcedAtEveryPosition) {
  const std::string model = GetParam();
  const nlohmann::json ref = testing::ReadJson(testing::SourcePath("tests/fixtures/reference/" + model + ".json"));
  Config config;
  config.model.path = testing::ModelDir(model);
  config.engine.backend = "cpu";
  config.engine.block_size = 4;
  config.engine.cpu_kv_cache_gib = 0.05;
  config.scheduler.max_num_seqs = 3;
  config.scheduler.max_num_batched_tokens = 64;
  config.scheduler.prefix_caching = true;
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();

  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    std::vector<int32_t> prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& step : ref["cases"][i]["steps"]) prompt.push_back(step["token"].get<int32_t>());
    prompts.push_back(prompt);
    for (int copy = 0; copy < 2; ++copy) {
      Request r;
      r.id = "case-" + std::to_string(i) + "-" + std::to_string(copy);
      r.prompt = prompt;
      r.sampling.temperature = 0;
      r.stopping.max_tokens = 1;
      r.stopping.ignore_eos = true;
      r.prompt_logprobs = 5;
      sinks.push_back(std::make_shared<CollectingSink>());
      r.sink = sinks.back();
      ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
    }
  }
  int compared = 0;
  for (size_t c = 0; c < sinks.size(); ++c) {
    const size_t i = c / 2;
    CollectingSink& sink = *sinks[c];
    sink.Wait();
    ASSERT_TRUE(sink.error.ok()) << sink.error;
    ASSERT_EQ(sink.finish, FinishReason::kLength);
    EXPECT_EQ(sink.usage.cached_prompt_tokens, 0) << "a scoring request computes its whole prompt";
    const std::vector<int32_t>& prompt = prompts[i];
    ASSERT_EQ(sink.prompt_logprobs.size(), prompt.size() - 1) << "one per prompt token after the first";
    for (size_t p = 0; p + 1 < prompt.size(); ++p) {
      EXPECT_EQ(sink.prompt_logprobs[p].token_id, prompt[p + 1]) << "case " << i << " position " << p;
      EXPECT_EQ(sink.prompt_logprobs[p].top.size(), 5u);
    }
    const size_t first = ref["cases"][i]["prompt_ids"].size() - 1;  // the row that scores the first greedy token
    const auto& steps = ref["cases"][i]["steps"];
    for (size_t s = 0; s < steps.size(); ++s) {
      const TokenLogprob& lp = sink.prompt_logprobs[first + s];
      const double want = steps[s]["top"][0][1].get<double>();  // greedy: the token is the reference's top one
      EXPECT_NEAR(lp.logprob, want, 2e-3 + 1e-4 * std::abs(want)) << model << " case " << i << " step " << s;
      for (size_t k = 0; k < 5; ++k) {
        // Near-equal alternatives may swap order; compare the value at each rank.
        const double ref_lp = steps[s]["top"][k][1].get<double>();
        EXPECT_NEAR(lp.top[k].logprob, ref_lp, 2e-3 + 1e-4 * std::abs(ref_lp))
            << model << " case " << i << " step " << s << " rank " << k;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 200) << "every greedy step of both copies is compared";
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back once all requests finished";
}

INSTANTIATE_TEST_SUITE_P(Models, PromptLogprobs,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny", "qwen3-tiny", "gemma3-tiny",
                                           "phi3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n.substr(0, n.find('-'));
                         });

}  // namespace
}  // namespace inferd

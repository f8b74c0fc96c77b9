// Speculative decoding on cuda: steps checking drafts (1 + k rows a sequence) replay the verify buckets' CUDA graphs,
// padded with sequences on the reserved block (engine/runtime/graph_buckets.h), and give the tokens of a run without
// drafts, as steps launched kernel by kernel do.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/greedy_runs.h"

namespace inferd {
namespace {

struct SpecRun {
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  int64_t verify_steps = 0, verify_graph_steps = 0, drafted = 0, accepted = 0;
};

// Each prompt's greedy continuation (top-2 logprobs kept), all submitted at once; the steps that checked drafts and
// those of them that replayed a graph.
SpecRun Generate(const Config& config, const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens) {
  SpecRun run;
  auto engine = Engine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  std::mutex mu;
  (*engine)->SetObservers(nullptr, [&](const StepRecord& s) {
    if (s.num_drafted == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    ++run.verify_steps;
    run.verify_graph_steps += s.graph;
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = "verify-" + std::to_string(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0;
    r.stopping.max_tokens = max_tokens - static_cast<int32_t>(i % 4);  // requests end in different steps
    r.stopping.ignore_eos = true;
    r.top_logprobs = 2;
    run.sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = run.sinks.back();
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  for (auto& s : run.sinks) {
    s->Wait();
    EXPECT_TRUE(s->error.ok()) << s->error;
  }
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back";
  run.drafted = stats.spec_draft_tokens;
  run.accepted = stats.spec_accepted_tokens;
  return run;
}

// The bundled SmolLM2 (real weights) in fp16, 12 copy-heavy prompts at once, every step drafting 4 n-gram tokens at
// most: the verify steps (up to 12 sequences, buckets of 1, 2, 4, 8 and 16) replay graphs, and graphs and eager
// steps give the tokens of the run without drafts wherever a margin of 0.1 decides them.
TEST(CudaVerifyGraphs, VerifyStepsReplayGraphsAndGiveTheTokensOfARunWithoutDrafts) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  const std::string path = testing::SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here (scripts/setup.sh fetches it)";
  std::vector<std::vector<int32_t>> prompts;
  for (const std::vector<int32_t>& span : testing::LcgPrompts(12, 7, 8, 3)) {
    std::vector<int32_t> p = span;  // a span, itself again, and its first half: the n-grams draft its rest
    p.insert(p.end(), span.begin(), span.end());
    p.insert(p.end(), span.begin(), span.begin() + span.size() / 2);
    prompts.push_back(p);
  }
  Config config;
  config.model.path = path;
  config.engine.backend = "cuda";
  config.engine.dtype = "float16";
  config.engine.gpu_memory_utilization = 0.3;
  config.scheduler.max_num_seqs = 64;
  config.scheduler.max_num_batched_tokens = 2048;
  const SpecRun plain = Generate(config, prompts, 40);
  config.speculative.method = "ngram";
  config.speculative.ngram_min = 1;
  config.speculative.max_tokens = 4;
  config.speculative.max_batch = 0;
  config.speculative.adaptive = false;  // every step drafts
  const SpecRun graphs = Generate(config, prompts, 40);
  config.engine.cuda_graphs = false;
  const SpecRun eager = Generate(config, prompts, 40);
  std::printf(
      "[ verify   ] graphs: %lld of %lld verify steps replayed a graph, %lld of %lld drafts kept; eager: %lld "
      "of %lld, %lld of %lld\n",
      static_cast<long long>(graphs.verify_graph_steps), static_cast<long long>(graphs.verify_steps),
      static_cast<long long>(graphs.accepted), static_cast<long long>(graphs.drafted),
      static_cast<long long>(eager.verify_graph_steps), static_cast<long long>(eager.verify_steps),
      static_cast<long long>(eager.accepted), static_cast<long long>(eager.drafted));
  EXPECT_EQ(plain.verify_steps, 0);
  EXPECT_GT(graphs.verify_steps, 10);
  EXPECT_GT(graphs.accepted, 0) << "drafts were kept";
  EXPECT_GT(graphs.verify_graph_steps * 10, graphs.verify_steps * 9) << "verify steps replay their buckets' graphs";
  EXPECT_EQ(eager.verify_graph_steps, 0);
  // On these random-token prompts a real model's margins fall under 0.1 often (213 of 432 positions are compared
  // on an H100): a quarter at least.
  const int positions = 12 * 36;
  EXPECT_GT(testing::SameTokensUntilANearTie(graphs.sinks, plain.sinks, 0.1), positions / 4) << "graphs";
  EXPECT_GT(testing::SameTokensUntilANearTie(eager.sinks, plain.sinks, 0.1), positions / 4) << "eager";
}

}  // namespace
}  // namespace inferd

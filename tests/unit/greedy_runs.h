// Greedy runs of a set of prompts through the real engine, and their comparison with a run of the same model
// another way (split over shards, heads padded): tokens equal up to a near-tie, logprobs within a tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"

namespace inferd::testing {

// n prompts of ids in [3, 203) from a linear congruential sequence seeded by `seed`, prompt i of first + step * i
// tokens (several pages long, some ending mid-page).
inline std::vector<std::vector<int32_t>> LcgPrompts(int n, uint32_t seed, int first, int step) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < first + step * i; ++t)
      p.push_back(static_cast<int32_t>((seed = seed * 1664525u + 1013904223u) % 200) + 3);
    prompts.push_back(p);
  }
  return prompts;
}

struct GreedyRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<TokenLogprob>> logprobs;  // the chosen token's and the top 2 (RunGreedy's top_logprobs)
  std::vector<std::vector<TokenLogprob>> prompt_logprobs;  // each prompt's, where RunGreedy was asked for them
  MemoryPlan plan;
  EngineStats stats;  // as the run ended
};

// Each prompt's greedy continuation of max_tokens (eos ignored), all submitted at once, on the backend `factory`
// makes (the config's without one); every block is back after.
inline GreedyRun RunGreedy(const Config& config, const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens,
                           const Engine::BackendFactory& factory = nullptr, int32_t top_logprobs = 2,
                           std::optional<int32_t> prompt_logprobs = std::nullopt) {
  GreedyRun run;
  auto engine = factory ? Engine::Create(config, factory) : Engine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = "greedy-" + std::to_string(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0;
    r.stopping.max_tokens = max_tokens;
    r.stopping.ignore_eos = true;
    r.top_logprobs = top_logprobs;
    r.prompt_logprobs = prompt_logprobs;
    sinks.push_back(std::make_shared<CollectingSink>());
    r.sink = sinks.back();
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  for (auto& s : sinks) {
    s->Wait();
    EXPECT_EQ(s->finish, FinishReason::kLength) << s->error;
    run.tokens.push_back(s->tokens);
    run.logprobs.push_back(s->logprobs);
    run.prompt_logprobs.push_back(s->prompt_logprobs);
  }
  run.plan = (*engine)->memory_plan();
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back";
  run.stats = stats;
  return run;
}

// Compares `got` with `want` prompt by prompt: equal tokens until one differs, which only a near-tie of `want`
// (top-2 margin under `flip_margin`: 1e-4 where only the order of sums differs) may do, and chosen logprobs within
// `tolerance`. Returns the positions compared.
inline int CompareGreedy(const GreedyRun& want, const GreedyRun& got, double tolerance, const std::string& what,
                         double flip_margin = 1e-4) {
  int compared = 0;
  EXPECT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < std::min(got.tokens.size(), want.tokens.size()); ++i) {
    EXPECT_EQ(got.tokens[i].size(), want.tokens[i].size()) << what;
    for (size_t s = 0; s < std::min(got.tokens[i].size(), want.tokens[i].size()); ++s) {
      const TokenLogprob& w = want.logprobs[i][s];
      const double margin = w.top.size() > 1 ? w.top[0].logprob - w.top[1].logprob : 1.0;
      if (got.tokens[i][s] != want.tokens[i][s]) {
        // Another order of sums rounds differently: only a near-tie may flip, and after it the sequences differ.
        EXPECT_LT(margin, flip_margin) << what << ", prompt " << i << " step " << s << ": a token flipped";
        break;
      }
      EXPECT_NEAR(got.logprobs[i][s].logprob, w.logprob, tolerance) << what << ", prompt " << i << " step " << s;
      ++compared;
    }
  }
  return compared;
}

// Compares two runs' answers (`b` the reference) request by request up to each one's first near-tie in `b` (a top-2
// margin under min_margin, which another order of sums may round either way): equal lengths and tokens, every
// request ended without an error. Returns the positions compared.
inline int SameTokensUntilANearTie(const std::vector<std::shared_ptr<CollectingSink>>& a,
                                   const std::vector<std::shared_ptr<CollectingSink>>& b, double min_margin) {
  EXPECT_EQ(a.size(), b.size());
  int compared = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_TRUE(a[i]->error.ok() && b[i]->error.ok()) << a[i]->error << b[i]->error;
    EXPECT_EQ(a[i]->tokens.size(), b[i]->tokens.size()) << "request " << i;
    EXPECT_EQ(a[i]->usage.completion_tokens, static_cast<int32_t>(a[i]->tokens.size())) << "request " << i;
    for (size_t s = 0; s < std::min(a[i]->tokens.size(), b[i]->tokens.size()); ++s) {
      const auto& top = b[i]->logprobs[s].top;
      if (top.size() < 2 || top[0].logprob - top[1].logprob < min_margin) break;
      EXPECT_EQ(a[i]->tokens[s], b[i]->tokens[s]) << "request " << i << " step " << s;
      ++compared;
    }
  }
  return compared;
}

}  // namespace inferd::testing

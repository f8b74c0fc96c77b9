// Speculative decoding through the real engine on the cpu backend (fp32): every test model, n-gram and suffix drafts,
// greedy and seeded sampling give the tokens a run without drafts gives, while drafts are proposed, checked and
// (some) accepted; blocks all come back. Prompts repeat a span so that drafts find matches, and the random-weight
// models' greedy outputs fall into loops the drafts then follow.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/greedy_runs.h"

namespace inferd {
namespace {

using testing::CompareGreedy;
using testing::GreedyRun;
using testing::LcgPrompts;
using testing::RunGreedy;

// Prompts of a random span repeated, then a random tail (copy-heavy text), beside plain random prompts.
std::vector<std::vector<int32_t>> Prompts() {
  std::vector<std::vector<int32_t>> prompts = LcgPrompts(3, 7, 5, 9);
  for (const std::vector<int32_t>& span : LcgPrompts(4, 11, 6, 5)) {
    std::vector<int32_t> p = span;
    p.insert(p.end(), span.begin(), span.end());
    p.insert(p.end(), span.begin(), span.begin() + span.size() / 2);
    prompts.push_back(p);
  }
  return prompts;
}

Config Small(const std::string& model, const std::string& method) {
  Config config;
  config.model.path = testing::ModelDir(model);
  config.engine.backend = "cpu";
  config.engine.block_size = 4;  // drafts cross block boundaries
  config.engine.cpu_kv_cache_gib = 0.05;
  config.engine.num_threads = 2;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_num_batched_tokens = 32;
  config.speculative.method = method;
  config.speculative.max_tokens = 5;
  config.speculative.ngram_min = 1;
  config.speculative.ngram_max = 4;
  config.speculative.adaptive = false;  // every step drafts, whatever the cpu's timings say
  return config;
}

class Speculative : public ::testing::TestWithParam<const char*> {};

TEST_P(Speculative, GivesTheTokensAndLogprobsOfARunWithoutDrafts) {
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  const GreedyRun plain = RunGreedy(Small(GetParam(), "off"), prompts, 24);
  EXPECT_EQ(plain.stats.spec_drafts, 0);
  for (const char* method : {"ngram", "suffix"}) {
    const GreedyRun spec = RunGreedy(Small(GetParam(), method), prompts, 24);
    const int compared = CompareGreedy(plain, spec, 1e-4, std::string(GetParam()) + " " + method);
    EXPECT_GT(compared, 24 * static_cast<int>(prompts.size()) / 2) << method;
    EXPECT_GT(spec.stats.spec_draft_tokens, 0) << method << ": drafts were checked";
    EXPECT_GT(spec.stats.spec_accepted_tokens, 0) << method << ": some were kept";
    EXPECT_LE(spec.stats.spec_accepted_tokens, spec.stats.spec_draft_tokens);
  }
}

struct Answer {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;
};

// Each prompt sampled at temperature 0.9, top-p 0.9, with presence and repetition penalties (rows read the tokens
// before them, drafts included), seeded, min_tokens 6 with stop ids (banned in the rows before the sixth token),
// eos honoured; the answers and the engine's stats as it ended.
std::pair<std::vector<Answer>, EngineStats> Sample(const Config& config,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   const std::vector<int32_t>& stop_ids) {
  std::vector<Answer> answers;
  auto engine = Engine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = "sampled-" + std::to_string(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.9f;
    r.sampling.repetition_penalty = 1.05f;
    r.sampling.presence_penalty = 0.2f;
    r.sampling.seed = 1000 + i;
    r.stopping.max_tokens = 30;
    r.stopping.min_tokens = 6;
    r.stopping.stop_token_ids = stop_ids;
    r.top_logprobs = 1;
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks.back();
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  for (auto& s : sinks) {
    s->Wait();
    EXPECT_TRUE(s->error.ok()) << s->error;
    answers.push_back({s->tokens, s->logprobs, s->finish});
  }
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back";
  return {answers, stats};
}

// Planned ahead (engine.plan_ahead on), a step that checked drafts is collected before the next is planned, also
// when the batch grew past speculative.max_batch in that step (so the next step may be planned ahead again): one
// request decodes alone, drafting, when the others arrive. Tokens as without drafts. (Before the engine looked for
// drafts in the step in flight, this aborted: the step planned ahead had advanced the sequence whose drafts were
// still being checked.)
TEST(SpeculativePlannedAhead, AStepThatCheckedDraftsIsCollectedBeforeTheNextIsPlanned) {
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  const auto run = [&](const std::string& method) {
    Config config = Small("qwen3-tiny", method);
    config.engine.plan_ahead = "on";
    config.speculative.max_batch = 1;
    auto engine = Engine::Create(config);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.id = "a" + std::to_string(i);
      r.prompt = prompts[i];
      r.sampling.temperature = 0;
      r.stopping.max_tokens = i == 0 ? 200 : 24;
      r.stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<testing::CollectingSink>());
      r.sink = sinks.back();
      EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
      // The first decodes alone (and drafts) for a while before the rest arrive.
      while (i == 0 && sinks[0]->num_tokens() < 4) absl::SleepFor(absl::Milliseconds(1));
    }
    std::vector<std::vector<int32_t>> tokens;
    for (auto& sink : sinks) {
      sink->Wait();
      EXPECT_TRUE(sink->error.ok()) << sink->error;
      tokens.push_back(sink->tokens);
    }
    if (method != "off") {
      EXPECT_GT((*engine)->Stats().spec_draft_tokens, 0);
    }
    return tokens;
  };
  EXPECT_EQ(run("ngram"), run("off"));
}

// A seeded request's row at position p draws with the uniform number of (seed, p) whether or not drafts came before
// it, so speculation keeps the very tokens (not only their distribution), penalties, bans and stop ids included.
TEST_P(Speculative, SeededSamplingGivesTheSameTokensWithPenaltiesBansAndStopIds) {
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  // Stop ids: tokens the plain run samples early, so that some requests end on them after min_tokens.
  auto [plain, plain_stats] = Sample(Small(GetParam(), "off"), prompts, {});
  ASSERT_EQ(plain.size(), prompts.size());
  std::vector<int32_t> stop_ids;
  for (const Answer& a : plain) stop_ids.push_back(a.tokens.at(8));
  std::tie(plain, plain_stats) = Sample(Small(GetParam(), "off"), prompts, stop_ids);
  int stopped = 0;
  for (const Answer& a : plain) stopped += a.finish == FinishReason::kStopToken;
  EXPECT_GT(stopped, 0);
  for (const char* method : {"ngram", "suffix"}) {
    const auto [spec, stats] = Sample(Small(GetParam(), method), prompts, stop_ids);
    ASSERT_EQ(spec.size(), plain.size());
    EXPECT_GT(stats.spec_draft_tokens, 0) << method;
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(spec[i].tokens, plain[i].tokens) << method << ", prompt " << i;
      EXPECT_EQ(spec[i].finish, plain[i].finish) << method << ", prompt " << i;
      ASSERT_EQ(spec[i].logprobs.size(), plain[i].logprobs.size());
      for (size_t t = 0; t < plain[i].logprobs.size(); ++t) {
        EXPECT_NEAR(spec[i].logprobs[t].logprob, plain[i].logprobs[t].logprob, 1e-4) << method << " " << i << " " << t;
      }
    }
  }
}

// Unseeded sampling, many requests of one repetitive prompt: the eighth token (after several steps that checked
// drafts, some kept) is distributed as without drafts — a two-sample χ² test over the frequent tokens and the rest.
// A rule that always keeps the first draft fails it (χ² 48 against 26 when tried); tests/unit/spec/verify_test.cc
// catches a subtler bias on known distributions.
TEST(SpeculativeSampling, TheTokensOfUnseededRequestsAreDistributedAsWithoutDrafts) {
  constexpr int kRequests = 1500;
  // A span, its greedy continuation, the span again: prompt lookup drafts the continuation, which sampling at a
  // low temperature often draws.
  const std::vector<int32_t> span = LcgPrompts(1, 5, 12, 0)[0];
  const GreedyRun greedy = RunGreedy(Small("qwen3-tiny", "off"), {span}, 3);
  ASSERT_EQ(greedy.tokens.size(), 1u);
  std::vector<int32_t> prompt = span;
  prompt.insert(prompt.end(), greedy.tokens[0].begin(), greedy.tokens[0].end());
  prompt.insert(prompt.end(), span.begin(), span.end());
  std::map<int32_t, int64_t> counts[2];
  for (int spec = 0; spec < 2; ++spec) {
    Config config = Small("qwen3-tiny", spec ? "ngram" : "off");
    config.scheduler.max_num_seqs = 64;
    config.scheduler.max_num_batched_tokens = 512;
    config.engine.cpu_kv_cache_gib = 0.2;
    config.scheduler.max_queue = kRequests;
    config.speculative.max_batch = 0;  // every step drafts
    auto engine = Engine::Create(config);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
    for (int i = 0; i < kRequests; ++i) {
      Request r;
      r.id = "u" + std::to_string(i);
      r.prompt = prompt;
      r.sampling.temperature = 0.5f;
      r.stopping.max_tokens = 8;
      r.stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<testing::CollectingSink>());
      r.sink = sinks.back();
      ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
    }
    for (auto& sink : sinks) {
      sink->Wait();
      ASSERT_EQ(sink->tokens.size(), 8u);
      ++counts[spec][sink->tokens[7]];
    }
    if (spec) {
      const EngineStats stats = (*engine)->Stats();
      EXPECT_GT(stats.spec_accepted_tokens, kRequests / 4) << "drafts were checked and kept";
    }
  }
  // Bins: tokens seen at least 20 times in both runs together, the rest in one.
  std::map<int32_t, int64_t> together;
  for (const auto& c : counts) {
    for (auto [t, n] : c) together[t] += n;
  }
  std::vector<std::array<double, 2>> bins(1, {0, 0});
  for (auto [t, n] : together) {
    if (n >= 20)
      bins.push_back({double(counts[0][t]), double(counts[1][t])});
    else
      for (int k = 0; k < 2; ++k) bins[0][k] += counts[k][t];
  }
  ASSERT_GE(bins.size(), 3u);
  double chi2 = 0;
  for (const auto& b : bins) {
    const double total = b[0] + b[1];
    if (total == 0) continue;
    for (int k = 0; k < 2; ++k) {
      const double expected = total / 2;  // both runs have kRequests samples
      chi2 += (b[k] - expected) * (b[k] - expected) / expected;
    }
  }
  // χ² with bins − 1 degrees of freedom: its 1 − 10⁻⁴ quantile, by the Wilson–Hilferty approximation.
  const double df = double(bins.size() - 1);
  const double z = 3.719;
  const double critical = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  EXPECT_LT(chi2, critical) << bins.size() << " bins";
}

INSTANTIATE_TEST_SUITE_P(TestModels, Speculative,
                         ::testing::Values("llama2-tiny", "llama3-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny",
                                           "gemma2-tiny", "gemma3-tiny", "phi3-tiny", "mixtral-tiny", "qwen3-moe-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace inferd

#include "engine/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/runtime/philox.h"
#include "tests/unit/random_sampling.h"

namespace inferd {
namespace {

std::map<int32_t, int> Histogram(const std::vector<float>& logits, const SamplingParams& p, int n, uint64_t seed) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    SamplingRow row{.params = p, .uniform = SamplingUniform(seed, i)};
    counts[Sample(l, row).token]++;
  }
  return counts;
}

TEST(Sampler, GreedyPicksTheArgmaxAndReportsRawLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  SamplingRow row{.params = p, .top_logprobs = 2};
  const SampleResult r = Sample(logits, row);
  EXPECT_EQ(r.token, 1);
  double z = 0;
  for (float v : {0.1f, 2.0f, -1.0f, 1.5f}) z += std::exp(v);
  EXPECT_NEAR(r.logprob.logprob, 2.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.logprob.top.size(), 2u);
  EXPECT_EQ(r.logprob.top[1].token_id, 3);
}

TEST(Sampler, TemperatureOneMatchesTheSoftmax) {
  SamplingParams p;
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 0.1 .. 0.4
  const int n = 40000;
  auto h = Histogram(logits, p, n, 7);
  for (int t = 0; t < 4; ++t) {
    const double expected = (t + 1) / 10.0;
    const double sd = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(h[t] / double(n), expected, 5 * sd) << "token " << t;
  }
}

TEST(Sampler, TopKTopPAndMinPKeepTheHeadInItsProportions) {
  // p = 0.1, 0.2, 0.3, 0.4. Each cut keeps tokens 2 and 3 here, which must then come 3 : 4 (not just "not 0, 1").
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  SamplingParams k;
  k.top_k = 2;
  SamplingParams tp;
  tp.top_p = 0.65f;  // 0.4 + 0.3 reaches it
  SamplingParams mp;
  mp.min_p = 0.6f;  // keeps p >= 0.24
  const int n = 8000;
  uint64_t seed = 3;
  for (const SamplingParams* p : {&k, &tp, &mp}) {
    auto h = Histogram(logits, *p, n, seed++);
    EXPECT_EQ(h.count(0) + h.count(1), 0u) << "the tail is cut";
    const double sd = std::sqrt(4.0 / 7 * 3.0 / 7 / n);
    EXPECT_NEAR(h[3] / double(n), 4.0 / 7.0, 5 * sd) << "top_k " << p->top_k << " top_p " << p->top_p;
    EXPECT_NEAR(h[2] / double(n), 3.0 / 7.0, 5 * sd) << "top_k " << p->top_k << " top_p " << p->top_p;
  }
}

// The chain's steps one by one: the candidates each cut keeps, their weights the softmax's, and a draw at every
// uniform number the token Sample gives for it.
TEST(SamplerChain, CandidatesAreWhatEachCutKeepsAndDrawsAreSamplesTokens) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 0.1 .. 0.4
  SamplingParams greedy;
  greedy.temperature = 0;
  Candidates c = CandidatesOf(logits, greedy);
  EXPECT_EQ(c.ids, std::vector<int32_t>{3});
  EXPECT_EQ(Draw(c, 0.999), 3);
  SamplingParams all;
  c = CandidatesOf(logits, all);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{3, 2, 1, 0}));
  for (size_t i = 0; i < c.ids.size(); ++i) EXPECT_NEAR(c.probs[i], (c.ids[i] + 1) / 10.0, 1e-7);  // float logits
  EXPECT_NEAR(c.total, 1.0, 1e-12);
  SamplingParams top_p;
  top_p.top_p = 0.65f;
  c = CandidatesOf(logits, top_p);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(c.total, 0.7, 1e-7);
  EXPECT_EQ(Draw(c, 0.0), 3);
  EXPECT_EQ(Draw(c, 4.0 / 7.0 - 1e-6), 3);
  EXPECT_EQ(Draw(c, 4.0 / 7.0 + 1e-6), 2);
  for (const SamplingParams& p : {all, top_p}) {
    for (int i = 0; i < 200; ++i) {
      const double u = SamplingUniform(11, i);
      std::vector<float> shaped = logits;
      SamplingRow row{.params = p, .uniform = u};
      EXPECT_EQ(Draw(CandidatesOf(logits, p), u), Sample(shaped, row).token) << i;
    }
  }
}

TEST(SamplerChain, ShapeLogitsAppliesTheBansAndTheMaskBeforeTheCandidates) {
  std::vector<float> logits = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f};
  const std::vector<int32_t> banned = {0};
  const std::vector<uint32_t> allowed = {0b11010};  // ids 1, 3, 4
  SamplingRow row{.banned = banned, .allowed = allowed};
  ShapeLogits(logits, row);
  EXPECT_EQ(logits[0], -INFINITY);
  EXPECT_EQ(logits[2], -INFINITY);
  EXPECT_EQ(logits[1], 4.0f);
  SamplingParams all;
  const Candidates c = CandidatesOf(logits, all);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(c.probs[3], 0.0);  // masked ids weigh nothing: they are never drawn
  EXPECT_EQ(c.probs[4], 0.0);
  EXPECT_EQ(Draw(c, 0.999999), 4);
}

TEST(Sampler, SeedReproducesAndDifferentSeedsDiffer) {
  SamplingParams p;
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.3f);
  auto run = [&](uint64_t seed) {
    std::vector<int32_t> out;
    for (int i = 0; i < 30; ++i) {
      std::vector<float> l = logits;
      SamplingRow row{.params = p, .uniform = SamplingUniform(seed, i)};
      out.push_back(Sample(l, row).token);
    }
    return out;
  };
  EXPECT_EQ(run(11), run(11));
  EXPECT_NE(run(11), run(12));
}

TEST(SamplingUniform, DependsOnSeedAndPositionOnlyAndIsUniform) {
  EXPECT_EQ(SamplingUniform(5, 17), SamplingUniform(5, 17));
  EXPECT_NE(SamplingUniform(5, 17), SamplingUniform(5, 18));
  EXPECT_NE(SamplingUniform(5, 17), SamplingUniform(6, 17));
  // Ten equal bins over 100k positions: each within 5 standard deviations of 10%.
  const int n = 100000;
  std::vector<int> bins(10, 0);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const double u = SamplingUniform(0x1234abcdULL, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    bins[static_cast<int>(u * 10)]++;
    sum += u;
  }
  const double sd = std::sqrt(0.1 * 0.9 / n);
  for (int b = 0; b < 10; ++b) EXPECT_NEAR(bins[b] / double(n), 0.1, 5 * sd) << "bin " << b;
  EXPECT_NEAR(sum / n, 0.5, 0.005);
}

TEST(Sampler, PenaltiesAndBannedIds) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0f;
  std::vector<float> logits = {2.0f, 1.0f, 0.5f};
  const std::vector<int32_t> tokens = {0};
  SamplingRow ctx{.params = p, .tokens = tokens, .num_prompt_tokens = 1};
  EXPECT_EQ(Sample(logits, ctx).token, 1) << "2.0 / 4 = 0.5 < 1.0";

  SamplingParams f;
  f.temperature = 0;
  f.frequency_penalty = 0.4f;
  logits = {2.0f, 1.5f, 0.5f};
  const std::vector<int32_t> out_tokens = {2, 0, 0};  // prompt [2], output [0, 0]
  SamplingRow fctx{.params = f, .tokens = out_tokens, .num_prompt_tokens = 1};
  EXPECT_EQ(Sample(logits, fctx).token, 1) << "2.0 - 2 * 0.4 = 1.2 < 1.5";

  SamplingParams g;
  g.temperature = 0;
  logits = {2.0f, 1.0f};
  const std::vector<int32_t> banned = {0};
  SamplingRow bctx{.params = g, .banned = banned};
  EXPECT_EQ(Sample(logits, bctx).token, 1);
}

TEST(Sampler, LogitBiasShiftsTheLogitsAfterThePenaltiesButNotTheReportedLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, 1.5f}, {2, 0.6f}};
  std::vector<float> logits = {2.0f, 1.6f, 1.0f};
  const std::vector<int32_t> tokens = {0};
  SamplingRow ctx{.params = p, .tokens = tokens, .num_prompt_tokens = 1, .top_logprobs = 1};
  const SampleResult r = Sample(logits, ctx);
  // 0: 2.0 / 2 + 1.5 = 2.5 (penalty first, then bias; bias first would give 3.5 / 2 = 1.75 < 1.6 + 0);
  // 2: 1.6; 1: 1.6 — 0 wins. Its reported logprob is the raw one: log softmax(2.0 | 2.0, 1.6, 1.0).
  EXPECT_EQ(r.token, 0);
  const double z = std::log(std::exp(2.0) + std::exp(1.6) + std::exp(1.0));
  EXPECT_NEAR(r.logprob.logprob, 2.0 - z, 1e-5);

  SamplingParams q;  // at temperature 1, -100 makes a token practically impossible, +100 practically certain
  q.logit_bias = {{1, 100.f}, {0, -100.f}};
  std::map<int32_t, int> counts;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = {5.0f, 0.0f, 4.0f};
    SamplingRow row{.params = q, .uniform = SamplingUniform(3, i)};
    counts[Sample(l, row).token]++;
  }
  EXPECT_EQ(counts[1], 200);
}

// Parameters drawn over their whole documented ranges, extremes included: the sampled token is in the
// vocabulary, not banned, and had a finite penalized logit; logprobs are finite, at most 0 and sorted.
TEST(Sampler, NoValidParametersProduceNanOrAnImpossibleToken) {
  std::mt19937 rng(2026);
  const int32_t vocab = 97;
  for (int trial = 0; trial < 3000; ++trial) {
    const SamplingParams p = testing::RandomSamplingParams(rng, vocab);
    const std::vector<float> logits = testing::RandomLogits(rng, vocab);
    std::vector<int32_t> tokens(rng() % 200);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    const std::vector<int32_t> banned = {static_cast<int32_t>(rng() % vocab)};
    SamplingRow row{.params = p,
                    .uniform = SamplingUniform(trial, 0),
                    .tokens = tokens,
                    .num_prompt_tokens = static_cast<int32_t>(tokens.size() / 2),
                    .banned = banned,
                    .top_logprobs = 5};
    std::vector<float> l = logits;
    const SampleResult r = Sample(l, row);
    const std::string what = "trial " + std::to_string(trial) + " temperature " + std::to_string(p.temperature) +
                             " repetition " + std::to_string(p.repetition_penalty);
    ASSERT_GE(r.token, 0) << what;
    ASSERT_LT(r.token, vocab) << what;
    ASSERT_NE(r.token, banned[0]) << what;
    for (float v : l) ASSERT_FALSE(std::isnan(v)) << what;
    ASSERT_TRUE(std::isfinite(l[r.token])) << what;
    ASSERT_TRUE(std::isfinite(r.logprob.logprob) && r.logprob.logprob <= 1e-6f) << what;
    for (size_t k = 0; k < r.logprob.top.size(); ++k) {
      ASSERT_TRUE(std::isfinite(r.logprob.top[k].logprob)) << what;
      if (k > 0) {
        ASSERT_LE(r.logprob.top[k].logprob, r.logprob.top[k - 1].logprob) << what;
      }
    }
  }
}

TEST(Sampler, ATinyRepetitionPenaltyPrefersTheRepeatedTokenInsteadOfBreaking) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.repetition_penalty = 1e-45f;  // inside the documented (0, 10]
  std::vector<float> logits = {3.0f, 0.5f, 2.0f, -1.0f};
  const std::vector<int32_t> history = {2};
  for (int i = 0; i < 20; ++i) {
    std::vector<float> l = logits;
    SamplingRow row{.params = p, .uniform = SamplingUniform(9, i), .tokens = history, .num_prompt_tokens = 1};
    EXPECT_EQ(Sample(l, row).token, 2) << "2.0 / 1e-45 is the largest logit (held at FLT_MAX), draw " << i;
  }
}

}  // namespace
}  // namespace inferd

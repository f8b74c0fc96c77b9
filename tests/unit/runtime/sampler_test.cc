#include "engine/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/runtime/philox.h"

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

TEST(Sampler, TopKTopPAndMinPCutTheTail) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  SamplingParams k;
  k.top_k = 2;
  auto hk = Histogram(logits, k, 4000, 3);
  EXPECT_EQ(hk.count(0) + hk.count(1), 0u);
  EXPECT_NEAR(hk[3] / 4000.0, 4.0 / 7.0, 0.04);
  SamplingParams tp;
  tp.top_p = 0.65f;  // 0.4 + 0.3 reaches it
  auto hp = Histogram(logits, tp, 4000, 4);
  EXPECT_EQ(hp.count(0) + hp.count(1), 0u);
  SamplingParams mp;
  mp.min_p = 0.6f;  // keeps p >= 0.24: tokens 2 and 3
  auto hm = Histogram(logits, mp, 4000, 5);
  EXPECT_EQ(hm.count(0) + hm.count(1), 0u);
  EXPECT_GT(hm[2], 0);
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

}  // namespace
}  // namespace inferd

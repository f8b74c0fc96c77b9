#include "engine/spec/verify.h"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <random>
#include <vector>

#include "engine/runtime/sampler.h"

namespace inferd {
namespace {

Candidates Row(std::vector<int32_t> ids, std::vector<double> probs) {
  Candidates c;
  c.ids = std::move(ids);
  c.probs = std::move(probs);
  c.total = 0;
  for (double p : c.probs) c.total += p;
  return c;
}

// Greedy rows (the argmax alone): drafts are kept while they equal it; the first that does not is replaced by it,
// and with all kept the last row adds its argmax.
TEST(VerifyDrafts, GreedyKeepsDraftsWhileTheyAreTheArgmax) {
  const std::vector<int32_t> argmax = {5, 6, 7, 8};
  Verified v = VerifyDrafts(argmax, std::vector<int32_t>{5, 6, 7});
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 8);
  v = VerifyDrafts(argmax, std::vector<int32_t>{5, 9, 7});
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.next, 6);
  v = VerifyDrafts(std::span(argmax).first(1), std::vector<int32_t>{});
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 5) << "no drafts: an ordinary step";
}

// The rule applied round after round to a stream with drafts that are often wrong, against the stream drawn
// without drafts: per position p_pos over 4 tokens, the first two tokens' joint frequencies over many streams.
// A rule sees the rows' distributions, the drafts and a uniform number a row.
using Rule = std::function<Verified(std::span<const Candidates>, std::span<const int32_t>, std::span<const double>)>;

// inferd's: each row sampled with its uniform number (as the sampler's Draw does without drafts), then checked.
Verified SampleAndCheck(std::span<const Candidates> rows, std::span<const int32_t> drafts, std::span<const double> u) {
  std::vector<int32_t> sampled;
  for (size_t i = 0; i < rows.size(); ++i) sampled.push_back(Draw(rows[i], u[i]));
  return VerifyDrafts(sampled, drafts);
}

double ChiSquareOfFirstTwoTokens(const Rule& rule, int64_t streams) {
  const std::array<Candidates, 4> p = {Row({0, 1, 2, 3}, {0.5, 0.25, 0.15, 0.10}),
                                       Row({2, 0, 1, 3}, {0.4, 0.3, 0.2, 0.1}), Row({1, 3, 0, 2}, {0.7, 0.1, 0.1, 0.1}),
                                       Row({0, 1, 2, 3}, {0.25, 0.25, 0.25, 0.25})};
  const std::array<int32_t, 3> drafted = {1, 2, 3};  // what a draft source proposes at positions 0, 1, 2
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::array<int64_t, 16> seen{};
  for (int64_t s = 0; s < streams; ++s) {
    std::vector<int32_t> stream;
    while (stream.size() < 2) {
      const size_t pos = stream.size();
      const size_t k = 3 - pos;  // drafts to the end of the positions drafted
      std::vector<double> u(k + 1);
      for (double& x : u) x = uniform(rng);
      const Verified v = rule(std::span(p).subspan(pos, k + 1), std::span(drafted).subspan(pos, k), u);
      for (int32_t i = 0; i < v.accepted; ++i) stream.push_back(drafted[pos + i]);
      stream.push_back(v.next);
    }
    ++seen[stream[0] * 4 + stream[1]];
  }
  const auto prob = [&](const Candidates& c, int32_t t) {
    for (size_t i = 0; i < c.ids.size(); ++i)
      if (c.ids[i] == t) return c.probs[i] / c.total;
    return 0.0;
  };
  double chi2 = 0;
  for (int32_t a = 0; a < 4; ++a) {
    for (int32_t b = 0; b < 4; ++b) {
      const double expected = double(streams) * prob(p[0], a) * prob(p[1], b);
      const double d = double(seen[a * 4 + b]) - expected;
      chi2 += d * d / expected;
    }
  }
  return chi2;
}

TEST(VerifyDrafts, TokensAreDistributedAsWithoutDraftsAndABiasedRuleIsCaught) {
  constexpr int64_t kStreams = 200000;
  constexpr double kCritical = 37.70;  // χ² with 15 degrees of freedom at p = 0.001
  EXPECT_LT(ChiSquareOfFirstTwoTokens(SampleAndCheck, kStreams), kCritical);
  // A rule that keeps drafts too readily: a draft the row did not sample is kept anyway one time in five.
  const Rule biased = [](std::span<const Candidates> rows, std::span<const int32_t> drafts, std::span<const double> u) {
    std::vector<int32_t> sampled;
    for (size_t i = 0; i < rows.size(); ++i) {
      sampled.push_back(i < drafts.size() && u[i] < 0.2 ? drafts[i] : Draw(rows[i], u[i]));
    }
    return VerifyDrafts(sampled, drafts);
  };
  EXPECT_GT(ChiSquareOfFirstTwoTokens(biased, kStreams), 10 * kCritical);
}

}  // namespace
}  // namespace inferd

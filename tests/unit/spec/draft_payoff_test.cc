#include "engine/spec/draft_payoff.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

// Steps at one batch size whose verifying steps cost `verify_s` and keep `accepted` drafted tokens a sequence,
// against plain steps of `plain_s`: the share of 1,000 steps that draft once the payoff has measured both.
double DraftingShare(DraftPayoff& payoff, int32_t n, double plain_s, double verify_s, int32_t accepted) {
  int drafted = 0;
  for (int step = 0; step < 1000; ++step) {
    const bool draft = payoff.ShouldDraft(n);
    drafted += draft;
    payoff.Record(n, draft ? 4 * n : 0, draft ? accepted * n : 0, draft ? verify_s : plain_s);
  }
  return drafted / 1000.0;
}

TEST(DraftPayoff, DraftsWhileTokensComeFasterThatWayAndProbesTheOtherSide) {
  DraftPayoff payoff(/*probe_every=*/64);
  // A verify step costs 1.2 plain ones and keeps 2 tokens a sequence: 3 tokens for 1.2, it pays.
  EXPECT_GT(DraftingShare(payoff, 1, 1.0, 1.2, 2), 0.95);
  // The text changes: nothing is kept any more, and a verify step costs twice a plain one.
  const double after = DraftingShare(payoff, 1, 1.0, 2.0, 0);
  EXPECT_LT(after, 0.05);
  EXPECT_GT(after, 0.0) << "drafting is tried again now and then";
}

TEST(DraftPayoff, EachBatchSizeClassDecidesOnItsOwnMeasurements) {
  DraftPayoff payoff;
  // Batch 1 gains (a step's time is its weights' read); batch 64 loses (rows cost time there).
  DraftingShare(payoff, 1, 1.0, 1.1, 3);
  DraftingShare(payoff, 64, 64.0, 200.0, 1);
  EXPECT_GT(DraftingShare(payoff, 1, 1.0, 1.1, 3), 0.95);
  EXPECT_LT(DraftingShare(payoff, 64, 64.0, 200.0, 1), 0.05);
  // 100 shares 64's class (64..127): its first steps already follow what 64's measured.
  EXPECT_FALSE(payoff.ShouldDraft(100));
}

TEST(DraftPayoff, ABatchThatShrinksWithinAClassDoesNotFoolIt) {
  DraftPayoff payoff(/*probe_every=*/1000);  // no probe in these steps
  // Steps of any batch size in 16..31 take 1.0 plain and 1.5 checking drafts, which keep 0.2 tokens a sequence:
  // drafting never pays (1.5 / 1.2 > 1). The batch shrinks from 31 as requests end, so the side measured first
  // is measured at more sequences than the other: once both sides are measured, no step drafts.
  int late_drafts = 0, step = 0;
  for (int32_t n = 31; n >= 16; --n) {
    for (int i = 0; i < 20; ++i, ++step) {
      const bool draft = payoff.ShouldDraft(n);
      if (step >= 10) late_drafts += draft;
      payoff.Record(n, draft ? 4 * n : 0, draft ? n / 5 : 0, draft ? 1.5 : 1.0);
    }
  }
  EXPECT_EQ(late_drafts, 0);
}

}  // namespace
}  // namespace inferd

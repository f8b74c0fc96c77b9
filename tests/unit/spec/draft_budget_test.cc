#include "engine/spec/draft_budget.h"

#include <gtest/gtest.h>

#include <cmath>

namespace inferd {
namespace {

// Drafts that are always kept earn the most tokens; drafts kept with probability α earn the k where α^k stays at
// least min_reach (α = 0.8, min_reach 0.2: k = 7, as 0.8^7 = 0.21 and 0.8^8 = 0.17).
TEST(DraftBudget, DraftsAsFarAsTheirAcceptanceReaches) {
  DraftBudget all_kept(10);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(all_kept.Next(), 10);
    all_kept.Record(10, 10);
  }
  DraftBudget budget(10, 0.2, 16, 1.0);  // no decay: the estimate is the plain ratio
  // 4 steps each keeping 4 tokens then a rejection (kept 16 + the starting 1, 4 rejections): α = 17 / 21.
  for (int i = 0; i < 4; ++i) budget.Record(5, 4);
  EXPECT_NEAR(budget.acceptance(), 17.0 / 21, 1e-12);
  EXPECT_EQ(budget.Next(), static_cast<int32_t>(std::floor(std::log(0.2) / std::log(17.0 / 21))));
  EXPECT_EQ(budget.Next(), 7);
}

// Drafts that are never kept stop being made, and one token is tried every probe_every steps; once drafts are kept
// again the budget grows back.
TEST(DraftBudget, LowAcceptanceTurnsDraftingOffWithAProbeNowAndThen) {
  DraftBudget budget(8, 0.2, 4, 0.5);
  for (int i = 0; i < 10; ++i) budget.Record(4, 0);
  int32_t drafted = 0, probes = 0;
  for (int step = 0; step < 12; ++step) {
    const int32_t k = budget.Next();
    drafted += k;
    probes += k == 1;
  }
  EXPECT_EQ(drafted, 3) << "one token every 4th step";
  EXPECT_EQ(probes, 3);
  for (int i = 0; i < 6; ++i) budget.Record(8, 8);
  EXPECT_EQ(budget.Next(), 8);
  EXPECT_EQ(DraftBudget(0).Next(), 0) << "a sequence that opted out";
}

}  // namespace
}  // namespace inferd

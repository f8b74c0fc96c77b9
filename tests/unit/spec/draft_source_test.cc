#include "engine/spec/draft_source.h"

#include <gtest/gtest.h>

#include <vector>

namespace inferd {
namespace {

using Tokens = std::vector<int32_t>;

TEST(NgramDrafts, ProposesWhatFollowedTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  NgramDrafts drafts(1, 3);
  // "5 6 7" occurred at 1 (followed by 8 9) and the last two tokens "6 7" also at 5 (followed by 1): the longest
  // suffix that occurred (n = 3: "5 6 7") wins over the more recent shorter one.
  EXPECT_EQ(drafts.Propose(Tokens{4, 5, 6, 7, 8, 9, 6, 7, 1, 5, 6, 7}, 4), (Tokens{8, 9, 6, 7}));
  // Of two earlier occurrences of the same suffix, the latest.
  EXPECT_EQ(drafts.Propose(Tokens{1, 2, 10, 1, 2, 20, 1, 2}, 1), Tokens{20});
  // Only n = 1 matches: "3" occurred at 2.
  EXPECT_EQ(drafts.Propose(Tokens{9, 9, 3, 4, 8, 3}, 2), (Tokens{4, 8}));
  // The draft reads on into itself past the sequence's end (the loop "1 2 3" goes on), and stops at max_tokens.
  EXPECT_EQ(drafts.Propose(Tokens{1, 2, 3, 1, 2}, 7), (Tokens{3, 1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(drafts.Propose(Tokens{1, 2, 3, 1, 2}, 1), Tokens{3});
}

TEST(NgramDrafts, NothingWhereTheSuffixNeverOccurredOrTheBoundsForbidIt) {
  EXPECT_TRUE(NgramDrafts(1, 3).Propose(Tokens{1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(NgramDrafts(1, 3).Propose(Tokens{}, 4).empty());
  EXPECT_TRUE(NgramDrafts(1, 3).Propose(Tokens{7}, 4).empty());
  EXPECT_TRUE(NgramDrafts(1, 3).Propose(Tokens{1, 2, 1}, 0).empty());
  // "1" repeats but min_n 2 asks for two tokens in a row.
  EXPECT_TRUE(NgramDrafts(2, 3).Propose(Tokens{1, 5, 6, 1}, 4).empty());
  // The occurrence lies before the lookback window.
  const Tokens far = {7, 8, 0, 0, 0, 0, 0, 1, 7};
  EXPECT_EQ(NgramDrafts(1, 1).Propose(far, 1), Tokens{8});
  EXPECT_TRUE(NgramDrafts(1, 1, /*lookback=*/4).Propose(far, 1).empty());
}

TEST(NgramDrafts, ARunOfOneTokenProposesMoreOfIt) {
  // The match overlaps the suffix (its latest occurrence starts a token back), and the draft follows the run.
  EXPECT_EQ(NgramDrafts(1, 4).Propose(Tokens{3, 3, 3, 3, 3}, 3), (Tokens{3, 3, 3}));
}

}  // namespace
}  // namespace inferd

#include "engine/spec/suffix_drafts.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/spec/suffix_trie.h"

namespace inferd {
namespace {

using Tokens = std::vector<int32_t>;

// Counted by hand, runs of up to 4 tokens of 1 2 3 1 2 4 1 2: the longest suffix that occurred with something after
// it is "1 2" (3 times, twice going on; "4 1 2" only at the end), continued by 3 and by 4 once each: 3 (the lower
// token among equals) with probability 1/2, then "1 2 3" by 1 (1/2 · 1), then the depth bound.
TEST(SuffixTrie, ContinuesTheLongestSuffixThatOccurredByItsMostFrequentContinuation) {
  SuffixTrie trie(4);
  const Tokens seq = {1, 2, 3, 1, 2, 4, 1, 2};
  trie.Add(seq);
  const auto [node, length] = trie.Match(seq);
  EXPECT_EQ(length, 2);
  double score = 0;
  EXPECT_EQ(trie.Continue(node, 5, 0.0, &score), (Tokens{3, 1}));
  EXPECT_DOUBLE_EQ(score, 1.0);
  EXPECT_EQ(trie.Continue(node, 1, 0.0, &score), Tokens{3}) << "at most max_tokens";
  EXPECT_TRUE(trie.Continue(node, 5, 0.6, &score).empty()) << "1/2 is under the least probability asked";
  // A second occurrence of "1 2 4" makes 4 the most frequent continuation.
  trie.Add(Tokens{1, 2, 4});
  const auto [again, again_length] = trie.Match(seq);
  EXPECT_EQ(again_length, 2);
  EXPECT_EQ(trie.Continue(again, 1, 0.0, &score), Tokens{4});
  EXPECT_DOUBLE_EQ(score, 2.0 / 3);
  EXPECT_EQ(trie.Match(Tokens{7, 8}).second, 0) << "a suffix that never occurred";
}

// A sequence added token by token (a cursor) indexes what adding it whole does; taking sequences back out leaves
// the trie of the others, node for node and draft for draft, and frees what only they held.
TEST(SuffixTrie, AppendingEqualsAddingAndRemovingLeavesTheOthers) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, 5);  // few tokens: many shared runs and branches
  std::vector<Tokens> seqs(6);
  for (Tokens& s : seqs) {
    s.resize(20 + rng() % 30);
    for (int32_t& t : s) t = token(rng);
  }
  SuffixTrie all(5), kept(5), appended(5);
  for (size_t i = 0; i < seqs.size(); ++i) {
    all.Add(seqs[i]);
    if (i % 2 == 1) kept.Add(seqs[i]);
    SuffixTrie::Cursor cursor;
    for (int32_t t : seqs[i]) appended.Append(cursor, t);
  }
  EXPECT_EQ(appended.num_nodes(), all.num_nodes());
  for (size_t i = 0; i < seqs.size(); i += 2) all.Remove(seqs[i]);
  EXPECT_EQ(all.num_nodes(), kept.num_nodes());
  for (int q = 0; q < 200; ++q) {
    Tokens query(1 + rng() % 6);
    for (int32_t& t : query) t = token(rng);
    const auto [a, la] = all.Match(query);
    const auto [b, lb] = kept.Match(query);
    ASSERT_EQ(la, lb) << q;
    double sa = 0, sb = 0;
    ASSERT_EQ(all.Continue(a, 6, 0.0, &sa), kept.Continue(b, 6, 0.0, &sb)) << q;
    ASSERT_DOUBLE_EQ(sa, sb) << q;
  }
  // Removing what is left empties it; freed nodes are reused.
  for (size_t i = 1; i < seqs.size(); i += 2) all.Remove(seqs[i]);
  EXPECT_EQ(all.num_nodes(), 1) << "the root alone";
  all.Add(seqs[1]);
  kept = SuffixTrie(5);
  kept.Add(seqs[1]);
  EXPECT_EQ(all.num_nodes(), kept.num_nodes());
}

// A sequence drafts from its own prompt and output: a span it is repeating comes back, at most as long as the
// matched suffix allows (max_spec_factor), and tokens given in pieces index what they do given at once.
TEST(SuffixDrafts, ARepeatedSpanOfTheSequenceComesBackAsLongAsItsMatchAllows) {
  const Tokens prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 5, 6, 10, 11, 12, 13};
  SuffixOptions options;
  options.max_depth = 12;
  options.min_token_prob = 0.1;
  SuffixDrafts drafts(options, nullptr);
  // "10 11 12 13" matched (4 tokens): a draft of up to 4 · 1.0 tokens of what followed it.
  EXPECT_EQ(drafts.Propose(prompt, 16), (Tokens{14, 15, 16, 17}));
  options.max_spec_factor = 2.0;
  SuffixDrafts longer(options, nullptr);
  EXPECT_EQ(longer.Propose(prompt, 16), (Tokens{14, 15, 16, 17, 18, 19, 20, 5})) << "8 allowed";
  EXPECT_EQ(longer.Propose(prompt, 3), (Tokens{14, 15, 16})) << "max_tokens";
  // The same tokens shown in pieces, as a sequence grows.
  SuffixDrafts grown(options, nullptr);
  EXPECT_TRUE(grown.Propose(std::span(prompt).first(5), 16).empty());
  EXPECT_EQ(grown.Propose(prompt, 16), longer.Propose(prompt, 16));
  options.max_depth = 8;
  EXPECT_EQ(SuffixDrafts(options, nullptr).Propose(prompt, 16), (Tokens{14, 15, 16, 17}))
      << "a run of 8 tokens at most: the match's 4 and 4 after them";
  EXPECT_TRUE(SuffixDrafts(options, nullptr).Propose(Tokens{1, 2, 3}, 4).empty()) << "nothing repeats";
}

// Recent outputs of other requests, shared: a new sequence that starts the way an earlier answer went is drafted
// that answer's continuation; the cache holds at most its token budget, the oldest outputs leaving first.
TEST(SuffixDrafts, AnotherRequestsRecentOutputIsDraftedAndTheCacheKeepsItsBudget) {
  SuffixCache cache(8, 40);
  const Tokens answer = {100, 101, 102, 103, 104, 105, 106, 107};
  cache.AddOutput(answer);
  SuffixOptions options;
  options.max_depth = 8;
  options.max_spec_factor = 2.0;
  SuffixDrafts drafts(options, &cache);
  EXPECT_EQ(drafts.Propose(Tokens{1, 2, 100, 101, 102}, 5), (Tokens{103, 104, 105, 106, 107}));
  // Its own tokens win where they promise more: here "100 101 102" went on as 200 201 twice in the sequence itself,
  // and in the cache now once as 103 and once as 999.
  cache.AddOutput(Tokens{100, 101, 102, 999});
  SuffixDrafts own(options, &cache);
  EXPECT_EQ(own.Propose(Tokens{100, 101, 102, 200, 201, 100, 101, 102, 200, 201, 100, 101, 102}, 2),
            (Tokens{200, 201}));
  // 40 tokens at most: five more outputs of 8 push the first two out.
  for (int32_t i = 0; i < 5; ++i) cache.AddOutput(Tokens(8, 300 + i));
  EXPECT_EQ(cache.tokens(), 40);
  EXPECT_TRUE(SuffixDrafts(options, &cache).Propose(Tokens{1, 2, 100, 101, 102}, 5).empty());
  cache.AddOutput(Tokens(41, 9));  // longer than the whole budget: not kept
  EXPECT_EQ(cache.tokens(), 40);
}

}  // namespace
}  // namespace inferd

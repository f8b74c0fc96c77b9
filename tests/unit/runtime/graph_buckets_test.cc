#include "engine/runtime/graph_buckets.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "engine/kv_cache/block_pool.h"
#include "engine/runtime/step_input.h"

namespace inferd {
namespace {

std::vector<GraphBucket> Decode(std::initializer_list<int32_t> seqs) {
  std::vector<GraphBucket> out;
  for (int32_t s : seqs) out.push_back({.tokens = s, .seqs = s});
  return out;
}

TEST(GraphBuckets, DecodeOnlyWithoutDrafts) {
  EXPECT_EQ(GraphBucketsFor(StepLimits{24, 2048, 16}), Decode({1, 2, 4, 8, 16, 24}));
}

// Verify buckets of 1 + max_drafts tokens a sequence up to the first batch holding max_draft_batch, where the
// tokens fit the logits rows (2 · max_num_seqs) and the token budget; all in the order of tokens, then sequences.
TEST(GraphBuckets, VerifyBucketsUpToTheDraftingBatch) {
  StepLimits limits{256, 8192, 16};
  limits.max_drafts = 4;
  limits.max_draft_batch = 20;
  const std::vector<GraphBucket> buckets = GraphBucketsFor(limits);
  std::vector<GraphBucket> want = Decode({1, 2, 4, 8, 16, 32, 64, 128, 256});
  for (int32_t s : {1, 2, 4, 8, 16, 32}) want.push_back({.tokens = 5 * s, .seqs = s});
  std::sort(want.begin(), want.end());
  EXPECT_EQ(buckets, want);
  EXPECT_TRUE(std::is_sorted(buckets.begin(), buckets.end()));
  EXPECT_EQ(buckets[1], (GraphBucket{.tokens = 2, .seqs = 2}));
  EXPECT_EQ(buckets[3], (GraphBucket{.tokens = 5, .seqs = 1}));

  limits.max_draft_batch = 0;  // any batch drafts: as far as the logits rows allow (102 × 5 ≤ 512)
  const std::vector<GraphBucket> any = GraphBucketsFor(limits);
  EXPECT_EQ(std::count_if(any.begin(), any.end(), [](GraphBucket b) { return !b.decode(); }), 7);  // 1 .. 64
  limits.max_num_batched_tokens = 100;  // and the token budget
  const std::vector<GraphBucket> few = GraphBucketsFor(limits);
  EXPECT_EQ(std::count_if(few.begin(), few.end(), [](GraphBucket b) { return !b.decode(); }), 5);  // 1 .. 16
}

TEST(GraphBuckets, PaddingSpreadsTheTokensOverTheSequencesItAdds) {
  EXPECT_EQ(PaddingSequences({.tokens = 10, .seqs = 2}, 1, 3), (std::vector<int32_t>{7}));
  EXPECT_EQ(PaddingSequences({.tokens = 20, .seqs = 4}, 1, 3), (std::vector<int32_t>{6, 6, 5}));
  EXPECT_EQ(PaddingSequences({.tokens = 8, .seqs = 8}, 3, 3), (std::vector<int32_t>{1, 1, 1, 1, 1}));
  EXPECT_TRUE(PaddingSequences({.tokens = 5, .seqs = 1}, 1, 3).empty());    // tokens left and no sequence to add
  EXPECT_TRUE(PaddingSequences({.tokens = 8, .seqs = 8}, 4, 5).empty());    // 4 sequences for 3 tokens
  EXPECT_TRUE(PaddingSequences({.tokens = 10, .seqs = 2}, 3, 6).empty());   // fewer sequences
  EXPECT_TRUE(PaddingSequences({.tokens = 10, .seqs = 2}, 1, 11).empty());  // fewer tokens
  EXPECT_EQ(PaddingPages({17, 16, 1}, 16), 4);
}

// A step of `drafts[s]` drafts for sequence s, each with a context of `context` tokens in its own blocks.
StepInput VerifyStep(const std::vector<int32_t>& drafts, int32_t context, int32_t block_size) {
  StepInput in = EmptyStepInput(block_size);
  int32_t next_block = 1;
  for (int32_t k : drafts) {
    const std::vector<int32_t> tokens(context, 7);
    std::vector<std::vector<int32_t>> tables(1);
    for (int32_t b = 0; b < BlocksFor(context, block_size); ++b) tables[0].push_back(next_block++);
    AddSequence(&in, tokens, context - 1 - k, context, tables, 1 + k);
    for (int32_t i = 0; i <= k; ++i) in.sampling.emplace_back().position = context - k + i;
  }
  return in;
}

TEST(GraphBuckets, TheFirstBucketThatHoldsTheStepReplaysIt) {
  StepLimits limits{64, 4096, 16};
  limits.max_drafts = 4;
  limits.max_draft_batch = 32;
  const std::vector<GraphBucket> buckets = GraphBucketsFor(limits);
  const int64_t pages = 1000;
  EXPECT_EQ(ChooseGraphBucket(VerifyStep({0}, 40, 16), buckets, pages), (GraphBucket{.tokens = 1, .seqs = 1}));
  EXPECT_EQ(ChooseGraphBucket(VerifyStep({0, 0, 0}, 40, 16), buckets, pages), (GraphBucket{.tokens = 4, .seqs = 4}));
  EXPECT_EQ(ChooseGraphBucket(VerifyStep({4}, 40, 16), buckets, pages), (GraphBucket{.tokens = 5, .seqs = 1}));
  // Two drafts of four: the one-sequence bucket cannot take the two tokens left, the two-sequence one can.
  EXPECT_EQ(ChooseGraphBucket(VerifyStep({2}, 40, 16), buckets, pages), (GraphBucket{.tokens = 10, .seqs = 2}));
  EXPECT_EQ(ChooseGraphBucket(VerifyStep({4, 1, 0}, 40, 16), buckets, pages), (GraphBucket{.tokens = 20, .seqs = 4}));
  // More sequences than the verify buckets take (they stop at 16: 32 of 5 tokens pass the 128 logits rows): no graph
  // (the step runs its kernels directly).
  EXPECT_TRUE(ChooseGraphBucket(VerifyStep(std::vector<int32_t>(40, 1), 40, 16), buckets, pages).empty());
  // A step with rows that do not sample (a prompt chunk) has none either.
  StepInput prefill = EmptyStepInput(16);
  const std::vector<int32_t> prompt(30, 3), pages_of(2, 1);
  AddSequence(&prefill, prompt, 0, 30, pages_of, /*sampled=*/true);
  EXPECT_TRUE(ChooseGraphBucket(prefill, buckets, pages).empty());
  // The padding's pages must fit the page table: 3 steps' pages + 1 here.
  const StepInput two = VerifyStep({2}, 40, 16);
  EXPECT_EQ(ChooseGraphBucket(two, buckets, two.kv_indptr.back() + 1), (GraphBucket{.tokens = 10, .seqs = 2}));
  EXPECT_NE(ChooseGraphBucket(two, buckets, two.kv_indptr.back()), (GraphBucket{.tokens = 10, .seqs = 2}));
}

// Padded, a step keeps its own rows as they were and gains sequences on the reserved block only, every row of
// which samples greedily.
TEST(GraphBuckets, PaddedStepsKeepTheirRowsAndAddSequencesOnTheReservedBlock) {
  std::mt19937 rng(3);
  StepLimits limits{64, 4096, 16};
  limits.max_drafts = 6;
  const std::vector<GraphBucket> buckets = GraphBucketsFor(limits);
  const int32_t reserved = 0;
  int padded_steps = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> drafts(1 + rng() % 12);
    for (int32_t& k : drafts) k = static_cast<int32_t>(rng() % 7);
    const StepInput in = VerifyStep(drafts, 10 + static_cast<int32_t>(rng() % 50), 16);
    const GraphBucket b = ChooseGraphBucket(in, buckets, 1 << 20);
    if (b.empty()) continue;
    const StepInput p = PadToBucket(in, b, reserved);
    ++padded_steps;
    ASSERT_EQ(p.num_seqs(), b.seqs);
    ASSERT_EQ(p.num_tokens(), b.tokens);
    ASSERT_EQ(p.num_logits(), b.tokens);
    ASSERT_EQ(static_cast<int32_t>(p.sampling.size()), b.tokens);
    for (int32_t t = 0; t < in.num_tokens(); ++t) {
      EXPECT_EQ(p.token_ids[t], in.token_ids[t]);
      EXPECT_EQ(p.positions[t], in.positions[t]);
      EXPECT_EQ(p.slot_mapping[0][t], in.slot_mapping[0][t]);
      EXPECT_EQ(p.logits_indices[t], in.logits_indices[t]);
    }
    for (int32_t t = in.num_tokens(); t < p.num_tokens(); ++t) {
      EXPECT_EQ(p.slot_mapping[0][t] / 16, reserved);
      EXPECT_EQ(p.logits_indices[t], t);
      EXPECT_EQ(p.sampling[t].params.temperature, 0);
    }
    for (int64_t i = in.kv_indptr.back(); i < p.kv_indptr.back(); ++i) EXPECT_EQ(p.kv_indices[0][i], reserved);
  }
  EXPECT_GT(padded_steps, 100) << "most random steps are replayed";
}

}  // namespace
}  // namespace inferd

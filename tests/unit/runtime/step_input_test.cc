// The step input every backend reads: tokens, positions, KV slots and the CSR page table, checked against
// values worked out by hand for a decode and a prefill chunk in one step.
#include "engine/runtime/step_input.h"

#include <gtest/gtest.h>

#include <vector>

namespace inferd {
namespace {

Sequence MakeSeq(int32_t num_tokens, std::vector<int32_t> blocks) {
  Sequence s;
  for (int32_t i = 0; i < num_tokens; ++i) s.tokens.push_back(1000 + i);
  s.num_prompt_tokens = num_tokens;
  s.block_tables = {std::move(blocks)};
  return s;
}

TEST(StepInput, DecodeAndPrefillChunkPackTheirTokensSlotsAndPageTable) {
  const int32_t bs = 4;
  // A: 9 tokens, 8 in the cache, decodes its 9th (position 8 → block 7, offset 0).
  Sequence a = MakeSeq(9, {3, 5, 7});
  // B: a 10-token prompt whose chunk [4, 10) runs now; one block more than needed is allocated.
  Sequence b = MakeSeq(10, {2, 9, 4, 11});
  StepPlan plan;
  plan.seqs = {{&a, 8, 1, true}, {&b, 4, 6, true}};
  plan.num_tokens = 7;
  const StepInput in = BuildStepInput(plan, bs);

  EXPECT_EQ(in.block_size, bs);
  EXPECT_EQ(in.token_ids, (std::vector<int32_t>{1008, 1004, 1005, 1006, 1007, 1008, 1009}));
  EXPECT_EQ(in.positions, (std::vector<int32_t>{8, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(in.slot_mapping[0],
            (std::vector<int32_t>{7 * 4 + 0, 9 * 4 + 0, 9 * 4 + 1, 9 * 4 + 2, 9 * 4 + 3, 4 * 4 + 0, 4 * 4 + 1}));
  EXPECT_EQ(in.query_start, (std::vector<int32_t>{0, 1, 7}));
  EXPECT_EQ(in.context_lens, (std::vector<int32_t>{9, 10}));
  // Pages cover the context only: A 3 pages (last holds 1 token), B 3 of its 4 blocks (last holds 2).
  EXPECT_EQ(in.kv_indptr, (std::vector<int32_t>{0, 3, 6}));
  EXPECT_EQ(in.kv_indices[0], (std::vector<int32_t>{3, 5, 7, 2, 9, 4}));
  EXPECT_EQ(in.kv_last_page_len, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(in.logits_indices, (std::vector<int32_t>{0, 6}));
  EXPECT_TRUE(in.sampling.empty()) << "sampling rows are the engine's to add";
}

TEST(StepInput, AChunkThatDoesNotReachTheEndSamplesNothingAndFullPagesAreWhole) {
  Sequence a = MakeSeq(20, {6, 1, 8});
  StepPlan plan;
  plan.seqs = {{&a, 0, 16, false}};
  plan.num_tokens = 16;
  const StepInput in = BuildStepInput(plan, 8);
  EXPECT_TRUE(in.logits_indices.empty());
  EXPECT_EQ(in.kv_indices[0], (std::vector<int32_t>{6, 1}));
  EXPECT_EQ(in.kv_last_page_len, (std::vector<int32_t>{8}));
  // Every token's slot agrees with the page table's formula.
  for (int32_t t = 0; t < in.num_tokens(); ++t) {
    const int32_t p = in.positions[t];
    EXPECT_EQ(in.slot_mapping[0][t], in.kv_indices[0][in.kv_indptr[0] + p / 8] * 8 + p % 8) << "token " << t;
  }
}

TEST(StepInput, EachKvGroupHasItsOwnSlotsAndPagesOverOneIndptr) {
  // A global group and a window group that let its first block go: position 9 of a 10-token sequence, window 4.
  Sequence a = MakeSeq(10, {});
  a.block_tables = {{3, 5, 7}, {kNoBlock, 8, 2}};
  StepPlan plan;
  plan.seqs = {{&a, 9, 1, true}};
  plan.num_tokens = 1;
  const StepInput in = BuildStepInput(plan, 4, /*num_kv_groups=*/2);
  ASSERT_EQ(in.num_kv_groups(), 2);
  EXPECT_EQ(in.kv_indptr, (std::vector<int32_t>{0, 3})) << "one indptr: every group lists the same positions";
  EXPECT_EQ(in.kv_indices[0], (std::vector<int32_t>{3, 5, 7}));
  EXPECT_EQ(in.kv_indices[1], (std::vector<int32_t>{kNoBlock, 8, 2})) << "a page let go stays in its place";
  EXPECT_EQ(in.slot_mapping[0], (std::vector<int32_t>{7 * 4 + 1}));
  EXPECT_EQ(in.slot_mapping[1], (std::vector<int32_t>{2 * 4 + 1}));
}

TEST(StepInputDeathTest, AWindowGroupWritesOnlyIntoBlocksItHolds) {
  Sequence a = MakeSeq(10, {});
  a.block_tables = {{3, 5, 7}, {8, 2, kNoBlock}};
  StepPlan plan;
  plan.seqs = {{&a, 9, 1, true}};
  EXPECT_DEATH(BuildStepInput(plan, 4, 2), "a block its sequence holds");
}

TEST(StepInputDeathTest, ASequenceWithoutBlocksForItsTokensIsAnInvariantFailure) {
  Sequence a = MakeSeq(9, {3, 5});
  StepPlan plan;
  plan.seqs = {{&a, 8, 1, true}};
  EXPECT_DEATH(BuildStepInput(plan, 4), "blocks for every token");
}

}  // namespace
}  // namespace inferd

// How a model's layers share KV blocks (engine/model/kv_groups.h): the groups Gemma-shaped patterns form, and the
// blocks a sequence takes at most, against counts worked out by hand.
#include "engine/model/kv_groups.h"

#include <gtest/gtest.h>

#include <vector>

namespace inferd {
namespace {

ModelConfig Layers(int32_t num_layers, int32_t window, int32_t pattern) {
  ModelConfig c;
  c.num_layers = num_layers;
  c.max_position_embeddings = 32768;
  if (window > 0) SetWindowPattern(&c, window, pattern);
  return c;
}

TEST(KvGroups, WithoutWindowsOneGroupHoldsEveryLayer) {
  const KvGroups g = KvGroupsOf(Layers(32, 0, 0));
  EXPECT_EQ(g.slots, 32);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{0}));
  EXPECT_EQ(g.slot_of[31], 31);
  EXPECT_EQ(g.group_of[31], 0);
  EXPECT_EQ(g.MaxBlocks(100, 16, 2048), 7) << "as a block table always was";
  EXPECT_EQ(g.MaxTokens(7, 16, 2048, 1 << 20), 112);
}

TEST(KvGroups, Gemma3FourBFormsSevenGroupsOfFiveSlots) {
  // 34 layers, every 6th global: layers 5, 11, 17, 23, 29 global, 29 layers of window 1024.
  const KvGroups g = KvGroupsOf(Layers(34, 1024, 6));
  EXPECT_EQ(g.slots, 5);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{0, 1024, 1024, 1024, 1024, 1024, 1024}));
  EXPECT_EQ(g.group_of[5], 0);
  EXPECT_EQ(g.slot_of[29], 4);
  EXPECT_EQ(g.group_of[0], 1);
  EXPECT_EQ(g.slot_of[0], 0);
  EXPECT_EQ(g.group_of[30], 6) << "the 26th window layer opens the last group, of four";
  EXPECT_EQ(g.slot_of[30], 0);
  EXPECT_EQ(g.slot_of[33], 3);
  // At 32k context with steps of 2048 tokens: 2048 global blocks, and per window group the window behind a step
  // and the step (3071 positions: 192 blocks, + 1 across a boundary).
  EXPECT_EQ(g.MaxBlocks(32768, 16, 2048), 2048 + 6 * 193);
  // A short sequence takes its own blocks in every group.
  EXPECT_EQ(g.MaxBlocks(100, 16, 2048), 7 * 7);
}

TEST(KvGroups, WindowsAsLongAsTheContextAreGlobal) {
  ModelConfig c = Layers(4, 0, 0);
  c.layer_window = {32768, 0, 32768, 0};
  const KvGroups g = KvGroupsOf(c);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{0}));
  EXPECT_EQ(g.slots, 4);
}

TEST(KvGroups, MaxTokensIsTheLongestSequenceThatFits) {
  const KvGroups g = KvGroupsOf(Layers(6, 16, 6));  // 5 window layers, 1 global: 6 groups of one slot
  ASSERT_EQ(g.num_groups(), 6);
  // Steps of 8 tokens: a window group holds at most BlocksFor(8 + 15) + 1 = 7 blocks of 4.
  EXPECT_EQ(g.MaxBlocks(1000, 4, 8), 250 + 5 * 7);
  const int64_t n = g.MaxTokens(300, 4, 8, 1 << 20);
  EXPECT_LE(g.MaxBlocks(n, 4, 8), 300);
  EXPECT_GT(g.MaxBlocks(n + 1, 4, 8), 300);
  EXPECT_EQ(n, (300 - 35) * 4);
}

}  // namespace
}  // namespace inferd

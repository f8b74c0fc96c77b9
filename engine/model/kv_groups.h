// How a model's layers share the KV pool's blocks. A block holds K and V for `slots` layers; layers are cut into
// groups of at most that many, and a sequence holds one block table per group. Layers that attend through the
// same sliding window form groups of their own, whose blocks go back to the pool once every later position is past
// them (vLLM's hybrid KV cache manager does the same). Without windows there is one group of every layer, and a
// block is what it always was.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"

namespace inferd {

struct KvGroups {
  int32_t slots = 0;              // layers' K and V per block
  std::vector<int32_t> windows;   // [groups] the group's sliding window in tokens; 0: global attention
  std::vector<int32_t> group_of;  // [layers]
  std::vector<int32_t> slot_of;   // [layers] the layer's K and V within its group's blocks

  int32_t num_groups() const { return static_cast<int32_t>(windows.size()); }
  // The most blocks a sequence of num_tokens tokens holds at once, over every group, when a step computes at most
  // max_step_tokens of its tokens (a window group holds the window behind the step's first token and the step's).
  int64_t MaxBlocks(int64_t num_tokens, int32_t block_size, int32_t max_step_tokens) const;
  // The longest sequence, at most `limit` tokens, whose MaxBlocks fit in num_blocks.
  int64_t MaxTokens(int64_t num_blocks, int32_t block_size, int32_t max_step_tokens, int64_t limit) const;
};

// Global layers (and windows no shorter than the model's context) form one class, each window's layers another;
// slots = the size of the smallest class, each class cut into groups of that many in layer order, global ones first.
// Gemma 3 270M (15 window layers, 3 global): 6 groups of 3 layers.
KvGroups KvGroupsOf(const ModelConfig& config);

}  // namespace inferd

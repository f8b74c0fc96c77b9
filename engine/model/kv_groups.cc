#include "engine/model/kv_groups.h"

#include <algorithm>
#include <map>

namespace inferd {

int64_t KvGroups::MaxBlocks(int64_t num_tokens, int32_t block_size, int32_t max_step_tokens) const {
  const auto blocks = [block_size](int64_t n) { return (n + block_size - 1) / block_size; };
  int64_t total = 0;
  for (int32_t w : windows) {
    // A step's positions and the window behind its first one span max_step_tokens + w - 1 positions.
    total += w == 0 ? blocks(num_tokens) : std::min(blocks(num_tokens), blocks(int64_t{max_step_tokens} + w - 1) + 1);
  }
  return total;
}

int64_t KvGroups::MaxTokens(int64_t num_blocks, int32_t block_size, int32_t max_step_tokens, int64_t limit) const {
  const auto fits = [&](int64_t n) { return MaxBlocks(n, block_size, max_step_tokens) <= num_blocks; };
  if (fits(limit)) return limit;
  int64_t lo = 0, hi = limit;  // fits(lo), !fits(hi)
  while (hi - lo > 1) (fits(lo + (hi - lo) / 2) ? lo : hi) = lo + (hi - lo) / 2;
  return lo;
}

KvGroups KvGroupsOf(const ModelConfig& config) {
  std::map<int32_t, std::vector<int32_t>> classes;  // window (0 first) → its layers, in order
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const int32_t w = config.window(layer);
    classes[w > 0 && w < config.max_position_embeddings ? w : 0].push_back(layer);
  }
  KvGroups g;
  g.slots = config.num_layers;
  for (const auto& [window, layers] : classes) g.slots = std::min(g.slots, static_cast<int32_t>(layers.size()));
  g.group_of.resize(config.num_layers);
  g.slot_of.resize(config.num_layers);
  for (const auto& [window, layers] : classes) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % g.slots == 0) g.windows.push_back(window);
      g.group_of[layers[i]] = g.num_groups() - 1;
      g.slot_of[layers[i]] = static_cast<int32_t>(i % g.slots);
    }
  }
  return g;
}

}  // namespace inferd

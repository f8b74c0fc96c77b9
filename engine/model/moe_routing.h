// A mixture of experts' routing of one row (LayerOp::kMoe), as transformers computes it: the softmax of the router's
// logits over every expert in fp32, the top k (the larger weight first, the lower expert among equals), their
// weights divided by their sum where the config says so (ModelConfig::normalize_top_k). The cpu backend runs it;
// the cuda kernels (kernels/moe_routing.h) are tested against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace inferd {

// probs: the row's `experts` logits in, their softmax out. order: scratch, resized to `experts`. ids and weights:
// `k` each.
inline void RouteRow(float* probs, int32_t experts, int32_t k, bool normalize, std::vector<int32_t>& order,
                     int32_t* ids, float* weights) {
  const float top = *std::max_element(probs, probs + experts);
  float total = 0;
  for (int32_t e = 0; e < experts; ++e) total += (probs[e] = std::exp(probs[e] - top));
  for (int32_t e = 0; e < experts; ++e) probs[e] /= total;
  order.resize(experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  float chosen = 0;
  for (int32_t j = 0; j < k; ++j) chosen += probs[order[j]];
  for (int32_t j = 0; j < k; ++j) {
    ids[j] = order[j];
    weights[j] = normalize ? probs[order[j]] / chosen : probs[order[j]];
  }
}

}  // namespace inferd

#include "engine/runtime/step_cost.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace inferd {
namespace {

// Σ min(k, w) for k = c − n + 1 .. c (the keys each of the n newest of c tokens attends to in a window of w; all
// of them for w = 0).
double WindowedKeys(int64_t c, int64_t n, int64_t w) {
  const auto sum = [](int64_t a, int64_t b) { return b < a ? 0.0 : double(a + b) * double(b - a + 1) / 2; };
  const int64_t first = c - n + 1;
  if (w <= 0 || c <= w) return sum(first, c);
  if (first >= w) return double(n) * double(w);
  return sum(first, w) + double(c - w) * double(w);
}

}  // namespace

StepCostModel::StepCostModel(const ModelConfig& c, const MemoryPlan& plan, int32_t block_size, int32_t devices)
    : hidden_(c.hidden_size), devices_(devices > 0 ? devices : 1) {
  const double H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, L = c.num_layers;
  const double q = static_cast<double>(c.q_width()), kv = static_cast<double>(c.kv_width());
  const double sparse = c.num_sparse_layers();
  sparse_layers_ = sparse;
  router_params_ = sparse * c.num_experts * H;
  layer_params_ = L * (H * (q + 2 * kv) + q * H) + (L - sparse) * 3 * H * I + router_params_;
  experts_ = c.num_experts;
  experts_per_token_ = c.experts_per_token;
  expert_params_ = sparse * 3 * H * c.moe_intermediate_size;  // one expert of every sparse layer
  const double norms = (c.arch->sandwich_norms() ? 4 : 2) * H + (c.arch->qk_norm() ? 2 * D : 0);
  other_params_ = L * (norms + (c.arch->qkv_bias() ? q + 2 * kv : 0)) + H;
  lm_head_params_ = double(c.vocab_size) * H;
  const double total =
      layer_params_ + experts_ * expert_params_ + other_params_ + lm_head_params_ * (c.tie_word_embeddings ? 1 : 2);
  element_bytes_ = total > 0 ? plan.weight_bytes / total : 0;
  product_bytes_ = wide_bytes_ = element_bytes_;
  const double products = layer_params_ - router_params_ + experts_ * expert_params_;
  if (plan.fp8_weights && devices_ == 1 && products > 0) {
    wide_bytes_ = 2;
    product_bytes_ = std::max(0.0, plan.weight_bytes - wide_bytes_ * (total - products)) / products;
  }
  kv_bytes_per_token_ = block_size > 0 ? double(plan.kv_bytes_per_block) / block_size : 0;
  attention_flops_per_key_ = 4 * L * q;
  std::map<int32_t, int32_t> kinds;
  for (int32_t l = 0; l < c.num_layers; ++l) ++kinds[c.window(l)];
  windows_.assign(kinds.begin(), kinds.end());
  layers_ = std::max(c.num_layers, 1);
}

std::pair<double, double> StepCostModel::SequenceMeans(int64_t context, int64_t new_tokens) const {
  double read = 0, keys = 0;
  for (auto [window, layers] : windows_) {
    read += layers * double(window > 0 ? std::min<int64_t>(context, window) : context);
    keys += layers * WindowedKeys(context, new_tokens, window);
  }
  return {read / layers_, keys / layers_};
}

StepCost StepCostModel::OfUniform(int64_t seqs, int64_t new_tokens, int64_t context, int64_t sampled_rows) const {
  const auto [read, keys] = SequenceMeans(context, new_tokens);
  return OfLayerMeans(seqs * new_tokens, sampled_rows, double(seqs) * read, double(seqs) * keys);
}

StepCost StepCostModel::Of(int64_t tokens, int64_t sampled_rows, int64_t context_tokens, int64_t attended_keys) const {
  return OfLayerMeans(tokens, sampled_rows, double(context_tokens), double(attended_keys));
}

StepCost StepCostModel::OfLayerMeans(int64_t tokens, int64_t sampled_rows, double context_tokens, double attended_keys,
                                     int64_t experts_touched) const {
  StepCost cost;
  // A mixture of experts reads the experts its tokens touch (a mean over the sparse layers): as counted, or of E
  // experts, each token taking k, the E (1 − (1 − k/E)^t) expected to be touched by t tokens routed at random.
  // Every token multiplies k of them.
  double touched = 0;
  if (experts_ > 0 && experts_touched >= 0 && sparse_layers_ > 0) {
    touched = double(experts_touched) / sparse_layers_;
  } else if (experts_ > 0) {
    touched = experts_ * (1 - std::pow(1 - double(experts_per_token_) / experts_, double(tokens)));
  }
  cost.bytes = product_bytes_ * (layer_params_ - router_params_ + touched * expert_params_) +
               wide_bytes_ * (router_params_ + other_params_ + (sampled_rows > 0 ? lm_head_params_ : 0) +
                              double(tokens) * hidden_) +  // the embedding rows looked up
               kv_bytes_per_token_ * context_tokens;
  cost.flops = (2 * (layer_params_ + experts_per_token_ * expert_params_) * double(tokens) +
                2 * lm_head_params_ * double(sampled_rows) + attention_flops_per_key_ * attended_keys) /
               devices_;
  return cost;
}

StepCost StepCostModel::Of(const StepInput& in, int64_t experts_touched) const {
  double context = 0, keys = 0;
  for (int32_t s = 0; s < in.num_seqs(); ++s) {
    const auto [read, attended] = SequenceMeans(in.context_lens[s], in.query_start[s + 1] - in.query_start[s]);
    context += read;
    keys += attended;  // token i of the n new ones attends to c - n + i + 1 keys (at most a layer's window)
  }
  return OfLayerMeans(in.num_tokens(), in.num_logits(), context, keys, experts_touched);
}

}  // namespace inferd

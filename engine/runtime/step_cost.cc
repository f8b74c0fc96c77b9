#include "engine/runtime/step_cost.h"

namespace inferd {

StepCostModel::StepCostModel(const ModelConfig& c, const MemoryPlan& plan, int32_t block_size, int32_t devices)
    : hidden_(c.hidden_size), devices_(devices > 0 ? devices : 1) {
  const double H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, L = c.num_layers;
  const double q = static_cast<double>(c.q_width()), kv = static_cast<double>(c.kv_width());
  layer_params_ = L * (H * (q + 2 * kv) + q * H + 3 * H * I);
  const double norms = (c.arch->sandwich_norms ? 4 : 2) * H + (c.arch->qk_norm ? 2 * D : 0);
  other_params_ = L * (norms + (c.arch->qkv_bias ? q + 2 * kv : 0)) + H;
  lm_head_params_ = double(c.vocab_size) * H;
  const double total = layer_params_ + other_params_ + lm_head_params_ * (c.tie_word_embeddings ? 1 : 2);
  element_bytes_ = total > 0 ? plan.weight_bytes / total : 0;
  kv_bytes_per_token_ = block_size > 0 ? double(plan.kv_bytes_per_block) / block_size : 0;
  attention_flops_per_key_ = 4 * L * q;
}

StepCost StepCostModel::Of(int64_t tokens, int64_t sampled_rows, int64_t context_tokens, int64_t attended_keys) const {
  StepCost cost;
  cost.bytes = element_bytes_ * (layer_params_ + other_params_ + (sampled_rows > 0 ? lm_head_params_ : 0) +
                                 double(tokens) * hidden_) +  // the embedding rows looked up
               kv_bytes_per_token_ * double(context_tokens);
  cost.flops = (2 * layer_params_ * double(tokens) + 2 * lm_head_params_ * double(sampled_rows) +
                attention_flops_per_key_ * double(attended_keys)) /
               devices_;
  return cost;
}

StepCost StepCostModel::Of(const StepInput& in) const {
  int64_t context = 0, keys = 0;
  for (int32_t s = 0; s < in.num_seqs(); ++s) {
    const int64_t c = in.context_lens[s], n = in.query_start[s + 1] - in.query_start[s];
    context += c;
    keys += n * c - n * (n - 1) / 2;  // token i of the n new ones attends to c - n + i + 1 keys
  }
  return Of(in.num_tokens(), in.num_logits(), context, keys);
}

}  // namespace inferd

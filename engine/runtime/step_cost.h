// What one step must read and compute at the least, from the model's shape and the memory plan: the numerators
// of model bandwidth utilisation (bytes / step time / read ceiling) and model FLOPs utilisation (FLOPs / step
// time / GEMM ceiling). The live metrics and inferd-bench count the same way. Per device: split over N devices
// (engine.tensor_parallel_size), a step reads each device's shard (the plan's weight bytes are one device's) and
// each device does 1/N of the FLOPs, so both ratios are against one device's ceilings.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/memory_plan.h"

namespace inferd {

struct StepCost {
  double bytes = 0;  // every layer's weights once, the LM head when a row is sampled, the K/V of every context
  double flops = 0;  // 2 per weight per token (the LM head only for sampled rows) + causal attention
};

class StepCostModel {
 public:
  StepCostModel(const ModelConfig& config, const MemoryPlan& plan, int32_t block_size, int32_t devices = 1);
  // Sliding-window layers (ModelConfig::layer_window) read and attend to at most their window of each context.
  // A mixture of experts reads `experts_touched` experts summed over its sparse layers (StepOutput's count), or
  // where that is -1 the number random routing is expected to touch.
  StepCost Of(const StepInput& input, int64_t experts_touched = -1) const;
  // A step of `seqs` sequences alike: each with `new_tokens` computed at the end of a context of `context` tokens
  // (the new ones included), `sampled_rows` rows sampled in all.
  StepCost OfUniform(int64_t seqs, int64_t new_tokens, int64_t context, int64_t sampled_rows) const;
  // From totals, every layer global: tokens computed, rows sampled, context tokens of all sequences (each read
  // once), and keys attended summed over the step's tokens (a prompt of n alone: n (n + 1) / 2).
  StepCost Of(int64_t tokens, int64_t sampled_rows, int64_t context_tokens, int64_t attended_keys) const;

  double element_bytes() const { return element_bytes_; }

 private:
  StepCost OfLayerMeans(int64_t tokens, int64_t sampled_rows, double context_tokens, double attended_keys,
                        int64_t experts_touched = -1) const;
  // One sequence's context tokens read and keys attended by its n newest tokens, each a mean over the layers.
  std::pair<double, double> SequenceMeans(int64_t context, int64_t new_tokens) const;

  double layer_params_ = 0;   // linear weights of all layers every token multiplies (routers, not experts)
  double expert_params_ = 0;  // one expert's linear weights summed over the sparse layers (a mixture of experts)
  double experts_ = 0, experts_per_token_ = 0;
  double sparse_layers_ = 0;
  double other_params_ = 0;    // norms and biases of all layers and the final norm (read, not multiplied)
  double lm_head_params_ = 0;  // vocab × hidden (the embedding table itself when tied)
  double router_params_ = 0;   // the mixtures' routers (kept in 16 bits beside fp8 products)
  double element_bytes_ = 0;   // bytes per stored weight: the plan's weight bytes / the model's parameters
  // Bytes per weight of the products (layers' linear weights and experts, routers aside) and of the rest
  // (embeddings, LM head, norms, routers): element_bytes_ both, but with fp8 products on one device 2 for the rest
  // and what the plan's weight bytes leave for the products (e4m3 and their scales).
  double product_bytes_ = 0, wide_bytes_ = 0;
  double kv_bytes_per_token_ = 0;
  double attention_flops_per_key_ = 0;  // QKᵀ and PV over all layers and heads
  int64_t hidden_ = 0;
  double devices_ = 1;                                // FLOPs are split over them
  std::vector<std::pair<int32_t, int32_t>> windows_;  // (window, 0 for global; layers with it)
  int32_t layers_ = 1;
};

}  // namespace inferd

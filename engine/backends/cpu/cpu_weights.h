// The cpu backend's weights: fp32 on the host, decoded from the model's tensor description, with q/k/v and
// gate/up fused and tied embeddings shared; or, with engine.cpu_weights: as_stored, the matrices as the checkpoint
// stores them (stored_matmul.h) and only the norms and biases in fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cpu/stored_matmul.h"
#include "engine/model/model_config.h"
#include "engine/model/model_tensors.h"
#include "engine/model/tensor_parallel.h"

namespace inferd {

// A row-major matrix [rows, cols] (a vector when rows == 1): in fp32 (data), or as stored (stored.parts; data
// empty).
struct Matrix {
  std::vector<float> data;
  int64_t rows = 0;
  int64_t cols = 0;
  StoredMatrix stored;

  bool is_stored() const { return !stored.parts.empty(); }
  int64_t bytes() const { return static_cast<int64_t>(sizeof(float) * data.size()) + stored.bytes(); }
};

struct CpuLayerWeights {
  Matrix input_norm;     // [1, hidden]
  Matrix qkv;            // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
  Matrix qkv_bias;       // [1, (num_heads + 2 * num_kv_heads) * head_dim], empty without QKV bias
  Matrix q_norm;         // [1, head_dim]: every query head's norm weights (Architecture::qk_norm); else empty
  Matrix k_norm;         // [1, head_dim]: every key head's
  Matrix attn_out_norm;  // [1, hidden]: on the attention output (Architecture::sandwich_norms); else empty
  Matrix mlp_out_norm;   // [1, hidden]: on the MLP output
  Matrix o;              // [hidden, num_heads * head_dim]
  Matrix post_norm;      // [1, hidden]
  Matrix gate_up;        // [2 * intermediate, hidden]: gate rows then up rows
  Matrix down;           // [hidden, intermediate]
  // A mixture-of-experts layer's router [experts, hidden] and each expert's gate/up [2 * moe_intermediate, hidden]
  // and down [hidden, moe_intermediate], in place of gate_up and down.
  Matrix router;
  std::vector<Matrix> expert_gate_up, expert_down;

  int64_t bytes() const;
};

struct CpuWeights {
  Matrix embed;        // [vocab, hidden]
  Matrix final_norm;   // [1, hidden]
  Matrix lm_head_own;  // [vocab, hidden]; empty when the embeddings are tied
  std::vector<CpuLayerWeights> layers;

  const Matrix& lm_head() const { return lm_head_own.rows == 0 ? embed : lm_head_own; }
  int64_t bytes() const;
};

// Decodes every tensor to fp32, stacking the parts of fused matrices row-wise. as_stored: the matrices whose tensors
// all CanStore stay as stored instead (the vectors are always fp32).
absl::StatusOr<CpuWeights> BuildCpuWeights(const ModelTensors& tensors, bool as_stored = false);

// One rank's part of a layer (engine/model/tensor_parallel.h): q/k/v (and its bias) and gate/up by output rows, the
// attention output and down products by input columns, the norms whole. fp32 matrices only.
CpuLayerWeights ShardLayer(const CpuLayerWeights& layer, const ModelConfig& config, const TensorParallelShard& shard);

}  // namespace inferd

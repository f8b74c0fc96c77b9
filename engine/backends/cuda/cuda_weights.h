// The cuda backend's weights: bf16 or fp16 on the device, built from the model's tensor description by a few
// threads, each through its own pinned staging (two buffers, so reading or decoding the next piece overlaps the
// copy of the last) on its own stream, with q/k/v and gate/up fused and tied embeddings shared. Never a
// whole-model copy on the host. With fp8, the layers' linear weights are quantized on the device as they arrive
// (per output channel, kernels/fp8.h); embeddings, norms, biases and the LM head stay in the compute dtype.
// A tensor-parallel rank uploads only its shard (engine/model/tensor_parallel.h): its heads' q/k/v rows and o
// columns, its MLP columns' gate/up rows and down columns; embeddings and norms whole; the LM head on rank 0 only.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/backends/cuda/gemm.h"
#include "engine/model/model_config.h"
#include "engine/model/model_tensors.h"
#include "engine/model/tensor_parallel.h"

namespace inferd::cuda {

// A linear layer's weight [rows, cols]: in the compute dtype, or fp8 e4m3 with one fp32 scale per row.
struct LinearWeight {
  DeviceBuffer data;
  DeviceBuffer scale;  // [rows]; empty unless fp8

  bool fp8() const { return scale.bytes() > 0; }
  Operand operand() const { return {data.get(), fp8() ? scale.get<float>() : nullptr}; }
};

struct CudaLayerWeights {
  DeviceBuffer input_norm;                   // [hidden]
  LinearWeight qkv;                          // [(heads + 2 * kv_heads) * head_dim, hidden]
  DeviceBuffer qkv_bias;                     // [(heads + 2 * kv_heads) * head_dim]; empty without QKV bias
  DeviceBuffer q_norm, k_norm;               // [head_dim] each: per-head norms (Qwen3, Gemma 3); else empty
  DeviceBuffer attn_out_norm, mlp_out_norm;  // [hidden] each: sandwich norms (Gemma 3); else empty
  LinearWeight o;                            // [hidden, heads * head_dim]
  DeviceBuffer post_norm;                    // [hidden]
  LinearWeight gate_up;                      // [2 * intermediate, hidden]: gate rows then up rows
  LinearWeight down;                         // [hidden, intermediate]
  // A sparse layer (ModelConfig::sparse, LayerOp::kMoe) in place of gate_up and down: the router [experts, hidden]
  // and every expert's weights stacked, gate/up [experts, 2 * its intermediate, hidden] (gate rows then up rows)
  // and down [experts, hidden, its intermediate] (kernels/moe_products.h); with fp8 weights the experts are e4m3
  // with a scale per row of each expert (the router stays in the compute dtype: its logits choose the experts).
  LinearWeight router;
  LinearWeight experts_gate_up, experts_down;
  // An fp8 KV cache holds K / k_cache_scale and V / v_cache_scale: the checkpoint's k_scale and v_scale, else 1.
  float k_cache_scale = 1.f, v_cache_scale = 1.f;
};

struct CudaWeights {
  DeviceBuffer embed;        // [vocab, hidden]
  DeviceBuffer final_norm;   // [hidden]
  DeviceBuffer lm_head_own;  // rank 0: [vocab, hidden]; another rank: its vocabulary run's rows; empty when tied
  IndexRange vocab;          // the LM head's rows this rank computes logits for (TensorParallelShard::vocab)
  std::vector<CudaLayerWeights> layers;
  bool fp8 = false;  // the layers' linear weights are fp8
  int64_t bytes = 0;

  // The whole LM head (rank 0 only).
  const void* lm_head() const { return lm_head_own.bytes() ? lm_head_own.get() : embed.get(); }
  // This rank's vocabulary run of it: `vocab.size()` rows of `hidden` elements of `element_bytes`.
  const void* lm_head_part(int64_t hidden, int64_t element_bytes) const {
    if (lm_head_own.bytes() && vocab.begin > 0) return lm_head_own.get();  // a rank past 0 holds only its run
    return static_cast<const char*>(lm_head()) + vocab.begin * hidden * element_bytes;
  }
};

// dtype: CUDA_R_16BF or CUDA_R_16F. fp8: quantize the layers' linear weights. Onto the current device, the
// shard of `c` that `shard` names (ShardOf(c, 1, 0): the whole model).
absl::StatusOr<CudaWeights> UploadWeights(const ModelTensors& tensors, cudaDataType_t dtype, bool fp8,
                                          const TensorParallelShard& shard, const ModelConfig& c);

}  // namespace inferd::cuda

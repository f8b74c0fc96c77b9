// The cuda backend's weights: bf16 or fp16 on the device, built from the model's tensor description by a few
// threads, each through its own pinned staging (two buffers, so reading or decoding the next piece overlaps the
// copy of the last) on its own stream, with q/k/v and gate/up fused and tied embeddings shared. Never a
// whole-model copy on the host.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/model/model_tensors.h"

namespace inferd::cuda {

struct CudaLayerWeights {
  DeviceBuffer input_norm;  // [hidden]
  DeviceBuffer qkv;         // [(heads + 2 * kv_heads) * head_dim, hidden]
  DeviceBuffer qkv_bias;    // [(heads + 2 * kv_heads) * head_dim]; empty without QKV bias
  DeviceBuffer o;           // [hidden, heads * head_dim]
  DeviceBuffer post_norm;   // [hidden]
  DeviceBuffer gate_up;     // [2 * intermediate, hidden]: gate rows then up rows
  DeviceBuffer down;        // [hidden, intermediate]
};

struct CudaWeights {
  DeviceBuffer embed;        // [vocab, hidden]
  DeviceBuffer final_norm;   // [hidden]
  DeviceBuffer lm_head_own;  // [vocab, hidden]; empty when tied
  std::vector<CudaLayerWeights> layers;
  int64_t bytes = 0;

  const void* lm_head() const { return lm_head_own.bytes() ? lm_head_own.get() : embed.get(); }
};

// dtype: CUDA_R_16BF or CUDA_R_16F.
absl::StatusOr<CudaWeights> UploadWeights(const ModelTensors& tensors, cudaDataType_t dtype);

}  // namespace inferd::cuda

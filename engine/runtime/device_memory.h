// What the cuda backend will allocate for a model and config, computed without a GPU: the capacity planner
// (`inferd plan`) prints it, and the backend's start-up measures the same quantities (weights and activations
// equal these formulas; the H100 run checks the whole plan against them).
#pragma once

#include <cstdint>

#include "engine/model/model_tensors.h"
#include "engine/runtime/backend.h"

namespace inferd {

// Workspaces the cuda backend allocates beside the per-token activations; kernels/ and the cuBLASLt wrapper
// define them, and the backend static_asserts that they agree.
inline constexpr int64_t kPlanAttentionWorkspaceBytes = (int64_t{128} << 20) + (int64_t{8} << 20);
inline constexpr int64_t kPlanGemmWorkspaceBytes = int64_t{32} << 20;
inline constexpr int64_t kPlanMaxTopLogprobs = 20;

// Device bytes of the weights as the cuda backend stores them (every present tensor, element_bytes each).
int64_t DeviceWeightBytes(const ModelTensors& tensors, int64_t element_bytes);
// Device bytes of the step workspace for the largest step (activations, logits, attention and GEMM workspaces).
int64_t DeviceActivationBytes(const ModelConfig& config, const StepLimits& limits, int64_t element_bytes);
// K and V of every layer for one block.
int64_t KvBytesPerBlock(const ModelConfig& config, int32_t block_size, int64_t element_bytes);
// Pinned-mirrored step inputs sized for the worst case (every sequence at the model's longest context, every
// penalty entry), plus the one block padded graph rows use: part of the plan's "other" bytes.
int64_t DeviceStepInputBytes(const ModelConfig& config, const StepLimits& limits, int32_t num_eos_ids,
                             int64_t element_bytes);

}  // namespace inferd

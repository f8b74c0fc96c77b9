// The reference backend: fp32 forward pass on the CPU (OpenBLAS GEMMs, OpenMP attention) over the paged
// KV pool, and the host sampler. It is the CI path and the way to run without a GPU.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model/model.h"
#include "engine/runtime/backend.h"

namespace inferd {

// Builds the fp32 weights from the model's tensor description. KV layout, per layer: K and V each
// [num_blocks, block_size, num_kv_heads, head_dim] fp32.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const Model& model, const EngineSection& engine);

}  // namespace inferd

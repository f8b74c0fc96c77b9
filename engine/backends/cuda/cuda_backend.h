// The GPU backend: bf16/fp16 weights on the device, cuBLASLt products, FlashInfer paged attention, our fused
// kernels and sampling on the device. Everything a step does runs in order on one stream: its inputs' copy from
// pinned memory (packed while the step before runs), its kernels or decode graph, the copy of its sampled token ids
// back. Logits never leave the device. The pieces: device_layout.h (what is allocated where), step_packing.h,
// decode_graphs.h, forward.h, kv_pool.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model/model.h"
#include "engine/runtime/backend.h"

namespace inferd {

// Why this machine or model cannot run on cuda ("" when it can): no device, unsupported head_dim.
std::string CudaUnsupportedReason(const ModelConfig& config);

// Free memory of device 0 in bytes; 0 when no device is visible.
int64_t CudaVisibleFreeBytes();

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model, const EngineSection& engine);

}  // namespace inferd

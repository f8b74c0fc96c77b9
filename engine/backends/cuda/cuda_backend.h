// The GPU backend: bf16/fp16 weights on the device, cuBLASLt GEMMs, FlashInfer paged attention, our fused
// kernels and sampling on the device. Step inputs go up in one copy from pinned memory on a copy stream;
// the sampled token ids come back the same way. Logits never leave the device.
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

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model, const EngineSection& engine);

}  // namespace inferd

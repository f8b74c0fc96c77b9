// The `quantization_config` of a Hugging Face config.json: which FP8 checkpoint layouts inferd reads. Two:
// compressed-tensors' "float-quantized" (llm-compressor: 8-bit float weights per tensor or per channel, dynamic
// per-token or static per-tensor 8-bit float inputs, an `ignore` list) and the older `quant_method: fp8`
// (per-tensor weight scales, static or dynamic input scales). compressed-tensors' `kv_cache_scheme` (8-bit float,
// per tensor, static) says each layer stores the scales of an 8-bit float KV cache. Anything else is refused,
// naming the field.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace inferd {

struct QuantizationConfig {
  bool fp8 = false;              // the layers' linear weights are stored as F8_E4M3 with a `weight_scale`
  bool kv_cache_scales = false;  // kv_cache_scheme: each layer's self_attn.k_scale and v_scale (per tensor)
  std::string description;       // e.g. "compressed-tensors float-quantized: weights per channel, inputs per token"
};

// Reads config["quantization_config"] when present; `out` stays "not fp8" when absent.
absl::Status ParseQuantizationConfig(const nlohmann::json& config, QuantizationConfig* out);

}  // namespace inferd

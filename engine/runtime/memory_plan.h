// How memory is shared out at start-up. Logged, returned by GetServerInfo, and equal to what was allocated.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"

namespace inferd {

struct MemoryPlan {
  std::string device;              // "cpu", or the GPU's name
  int64_t device_total_bytes = 0;  // cuda: the device's memory; cpu: 0
  int64_t device_free_bytes = 0;   // cuda: free before inferd allocated anything; cpu: 0
  int64_t budget_bytes = 0;        // cuda: device_free_bytes × gpu_memory_utilization; cpu: the sum below
  int64_t weight_bytes = 0;        // the backend's weights as stored for compute
  int64_t activation_bytes = 0;    // peak step workspace at the largest step
  int64_t other_bytes = 0;         // cuda: context, library handles and workspaces taken since start-up
  int64_t kv_bytes_per_block = 0;  // K and V of all layers for one block
  std::string kv_dtype;            // what the KV cache stores: float32, bfloat16, float16 or fp8_e4m3
  bool fp8_weights = false;        // cuda: the layers' products and experts e4m3 (a scale a row), the rest 2 bytes
  int32_t num_blocks = 0;
  int32_t num_swap_blocks = 0;        // host swap space, in blocks (engine.swap_space_gib)
  int32_t num_host_cache_blocks = 0;  // host tier of the prefix cache, in blocks (engine.host_kv_cache_gib)

  // The host pool: swap space and the host tier together.
  int32_t num_host_blocks() const { return num_swap_blocks + num_host_cache_blocks; }

  int64_t kv_bytes() const { return int64_t{num_blocks} * kv_bytes_per_block; }
  std::string ToString() const;
};

// Sets plan->num_blocks: engine.num_blocks when set, else what the budget leaves after weights, activations
// and other bytes (cuda), or engine.cpu_kv_cache_gib (cpu); num_swap_blocks from engine.swap_space_gib and
// num_host_cache_blocks from engine.host_kv_cache_gib.
// Fails naming the setting when nothing fits, or when host memory cannot hold what is asked of it.
absl::Status SizeKvPool(const EngineSection& engine, MemoryPlan* plan);

}  // namespace inferd

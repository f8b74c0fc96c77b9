// The KV pool on the device and its host swap space. Per layer K then V, each [num_blocks, block_size,
// num_kv_heads, head_dim] (FlashInfer's NHD pages); the last block is reserved for the padding rows of decode
// graphs, outside the scheduler's pool. Swap space is pinned, mapped host memory laid out [swap block][layer]
// [K, V][block]; blocks move by a copy kernel on the stream the steps run on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/device_layout.h"

namespace inferd::cuda {

class KvPool {
 public:
  // num_blocks, the reserved block included; any pool held before is freed first.
  absl::Status Allocate(const DeviceLayout& layout, int32_t num_layers, int32_t num_blocks);
  void Free() { kv_ = DeviceBuffer(); }
  absl::Status AllocateSwapSpace(int32_t num_blocks);
  // Copies `out` to the host and `in` back on `stream`, outs first, in order with the steps on that stream.
  absl::Status Swap(std::span<const BlockCopy> out, std::span<const BlockCopy> in, cudaStream_t stream);

  bool allocated() const { return kv_.bytes() > 0; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t reserved_block() const { return num_blocks_ - 1; }
  int64_t bytes() const { return static_cast<int64_t>(kv_.bytes()); }
  char* data() const { return kv_.get<char>(); }
  int64_t layer_bytes() const { return int64_t{num_blocks_} * block_bytes_; }  // one layer's K (or V)

 private:
  DeviceBuffer kv_;
  int32_t num_blocks_ = 0;
  int32_t num_layers_ = 0;
  int64_t block_bytes_ = 0;         // K or V of one layer for one block
  PinnedBuffer swap_, swap_lists_;  // the lists: device blocks then host blocks, for the outs then the ins
  char* swap_dev_ = nullptr;
  int32_t* swap_lists_dev_ = nullptr;
  int32_t num_swap_blocks_ = 0;
};

}  // namespace inferd::cuda

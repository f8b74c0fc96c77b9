// Copies whole KV blocks between the device pool and host swap space in one launch: the kernel reads and writes
// the pinned host memory directly over the bus (mapped), so a swap of many blocks is not thousands of memcpys.
// Raw pointers + sizes + stream in, cudaError_t out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// Pool layout: for each layer, K then V, each [num_blocks, block_bytes]; `layer_bytes` is one of those arrays.
// Host layout: [host block][layer][K, V][block_bytes]. Copy i moves every layer's K and V of device block
// device_blocks[i] to host block host_blocks[i] (to_host) or back. The index arrays are device-readable (device
// or mapped host memory). block_bytes must be a multiple of 16.
cudaError_t CopyKvBlocks(char* pool, char* host, const int32_t* device_blocks, const int32_t* host_blocks,
                         int32_t num_copies, int32_t num_layers, int64_t layer_bytes, int64_t block_bytes, bool to_host,
                         cudaStream_t stream);

}  // namespace inferd::kernels

#include "kernels/kv_swap.h"

namespace inferd::kernels {
namespace {

// One CTA per (copy, layer, K or V): 16-byte moves of one block.
__global__ void CopyKvBlocksKernel(char* pool, char* host, const int32_t* device_blocks, const int32_t* host_blocks,
                                   int32_t num_layers, int64_t layer_bytes, int64_t block_bytes, bool to_host) {
  const int32_t copy = blockIdx.x;
  const int32_t layer_kv = blockIdx.y;  // layer * 2 + (0 for K, 1 for V)
  uint4* dev = reinterpret_cast<uint4*>(pool + layer_kv * layer_bytes + int64_t{device_blocks[copy]} * block_bytes);
  uint4* hst = reinterpret_cast<uint4*>(host + (int64_t{host_blocks[copy]} * 2 * num_layers + layer_kv) * block_bytes);
  const uint4* src = to_host ? dev : hst;
  uint4* dst = to_host ? hst : dev;
  for (int64_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

cudaError_t CopyKvBlocks(char* pool, char* host, const int32_t* device_blocks, const int32_t* host_blocks,
                         int32_t num_copies, int32_t num_layers, int64_t layer_bytes, int64_t block_bytes, bool to_host,
                         cudaStream_t stream) {
  if (num_copies <= 0) return cudaSuccess;
  if (block_bytes % 16 != 0 || num_layers <= 0 || 2 * num_layers > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_copies), static_cast<unsigned>(2 * num_layers));
  CopyKvBlocksKernel<<<grid, 256, 0, stream>>>(pool, host, device_blocks, host_blocks, num_layers, layer_bytes,
                                               block_bytes, to_host);
  return cudaGetLastError();
}

}  // namespace inferd::kernels

#include "engine/backends/cuda/kv_pool.h"

#include <algorithm>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/check.h"
#include "engine/status_macros.h"
#include "kernels/kv_swap.h"

namespace inferd::cuda {

absl::Status KvPool::Allocate(const DeviceLayout& layout, int32_t num_layers, int32_t num_blocks) {
  kv_ = DeviceBuffer();
  num_blocks_ = num_blocks;
  num_layers_ = num_layers;
  block_bytes_ = layout.kv_block_bytes;
  return kv_.Allocate(int64_t{num_blocks} * layout.kv_bytes_per_block);
}

absl::Status KvPool::AllocateSwapSpace(int32_t num_blocks) {
  INFERD_CHECK(allocated(), "the KV pool is allocated before its swap space (it sets the block geometry)");
  INFERD_RETURN_IF_ERROR(swap_.Allocate(int64_t{num_blocks} * 2 * num_layers_ * block_bytes_));
  const int64_t max_copies = std::max<int64_t>(num_blocks, num_blocks_);
  INFERD_RETURN_IF_ERROR(swap_lists_.Allocate(4 * max_copies * sizeof(int32_t)));
  void* p = nullptr;
  INFERD_CUDA(cudaHostGetDevicePointer(&p, swap_.get(), 0));
  swap_dev_ = static_cast<char*>(p);
  INFERD_CUDA(cudaHostGetDevicePointer(&p, swap_lists_.get(), 0));
  swap_lists_dev_ = static_cast<int32_t*>(p);
  num_swap_blocks_ = num_blocks;
  return absl::OkStatus();
}

absl::Status KvPool::Swap(std::span<const BlockCopy> out, std::span<const BlockCopy> in, cudaStream_t stream) {
  if (out.empty() && in.empty()) return absl::OkStatus();
  INFERD_CHECK(num_swap_blocks_ > 0 && int64_t(out.size() + in.size()) * 4 * sizeof(int32_t) <= swap_lists_.bytes(),
               "swap copies fit the lists sized for the pool");
  INFERD_CUDA(cudaStreamSynchronize(stream));  // the last swap's kernels have read the lists
  int32_t* lists = swap_lists_.get<int32_t>();
  size_t at = 0;
  for (std::span<const BlockCopy> copies : {out, in}) {
    for (size_t i = 0; i < copies.size(); ++i) {
      INFERD_CHECK(copies[i].device_block >= 0 && copies[i].device_block < reserved_block() &&
                       copies[i].host_block >= 0 && copies[i].host_block < num_swap_blocks_,
                   "swap copies name blocks of the pool and the swap space");
      lists[at + i] = copies[i].device_block;
      lists[at + copies.size() + i] = copies[i].host_block;
    }
    at += 2 * copies.size();
  }
  const int32_t n_out = static_cast<int32_t>(out.size()), n_in = static_cast<int32_t>(in.size());
  // Outs read blocks before the next step reuses them; ins land before it reads them.
  INFERD_CUDA(kernels::CopyKvBlocks(data(), swap_dev_, swap_lists_dev_, swap_lists_dev_ + n_out, n_out, num_layers_,
                                    layer_bytes(), block_bytes_, /*to_host=*/true, stream));
  INFERD_CUDA(kernels::CopyKvBlocks(data(), swap_dev_, swap_lists_dev_ + 2 * n_out, swap_lists_dev_ + 2 * n_out + n_in,
                                    n_in, num_layers_, layer_bytes(), block_bytes_, /*to_host=*/false, stream));
  return absl::OkStatus();
}

}  // namespace inferd::cuda

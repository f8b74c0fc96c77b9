// Block-wide reductions shared by the kernels (device code only).
#pragma once

namespace inferd::kernels {

// The sum of every thread's v, returned to all threads of a block of kThreads (a multiple of 32, ≤ 1024).
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float total = partial[0];
  __syncthreads();  // the block may reduce again
  return total;
}

}  // namespace inferd::kernels

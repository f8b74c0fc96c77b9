// Block-wide reductions shared by the kernels (device code only).
#pragma once

namespace inferd::kernels {

// The sum (or, with kMax, the largest) of every thread's v, returned to all threads of a block of kThreads (a
// multiple of 32, ≤ 1024).
template <int kThreads, bool kMax = false>
__device__ __forceinline__ float BlockReduce(float v) {
  __shared__ float partial[kThreads / 32];
  const auto op = [](float a, float b) { return kMax ? fmaxf(a, b) : a + b; };
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffff, v, offset));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : (kMax ? -INFINITY : 0.f);
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffff, v, offset));
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float total = partial[0];
  __syncthreads();  // the block may reduce again
  return total;
}

template <int kThreads>
__device__ __forceinline__ float BlockSum(float v) {
  return BlockReduce<kThreads, false>(v);
}
template <int kThreads>
__device__ __forceinline__ float BlockMax(float v) {
  return BlockReduce<kThreads, true>(v);
}

}  // namespace inferd::kernels

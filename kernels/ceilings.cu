#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/ceilings.h"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 512;

__global__ void ReadReduceKernel(const float4* __restrict__ data, int64_t n4, float* out) {
  float acc = 0.f;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  // Four independent loads in flight per iteration.
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const float4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
    acc += (a.x + a.y + a.z + a.w) + (b.x + b.y + b.z + b.w) + (c.x + c.y + c.z + c.w) + (d.x + d.y + d.z + d.w);
  }
  for (; i < n4; i += stride) {
    const float4 a = data[i];
    acc += a.x + a.y + a.z + a.w;
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
  __shared__ float partial[kThreads / 32];
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) s += partial[w];
    atomicAdd(out, s);
  }
}

// splitmix64 of (seed, i), top 24 bits scaled to [-1, 1).
__host__ __device__ inline float Uniform(uint64_t seed, int64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T>
__global__ void FillUniformKernel(T* data, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    data[i] = static_cast<T>(Uniform(seed, i));
  }
}

}  // namespace

float UniformAt(uint64_t seed, int64_t i) {
  return Uniform(seed, i);
}

cudaError_t FillUniform16(void* data, int64_t n, bool bf16, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  if (bf16) {
    FillUniformKernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), n, seed);
  } else {
    FillUniformKernel<<<blocks, 256, 0, stream>>>(static_cast<__half*>(data), n, seed);
  }
  return cudaGetLastError();
}

cudaError_t ReadReduce(const float4* data, int64_t n4, float* out, int num_sms, cudaStream_t stream) {
  if (n4 <= 0) return cudaSuccess;
  ReadReduceKernel<<<num_sms * 4, kThreads, 0, stream>>>(data, n4, out);
  return cudaGetLastError();
}

}  // namespace inferd::kernels

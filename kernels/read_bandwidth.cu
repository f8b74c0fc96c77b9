#include "kernels/read_bandwidth.h"

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

}  // namespace

cudaError_t ReadReduce(const float4* data, int64_t n4, float* out, int num_sms, cudaStream_t stream) {
  if (n4 <= 0) return cudaSuccess;
  ReadReduceKernel<<<num_sms * 4, kThreads, 0, stream>>>(data, n4, out);
  return cudaGetLastError();
}

}  // namespace inferd::kernels

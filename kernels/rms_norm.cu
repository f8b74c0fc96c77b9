#include "kernels/block_reduce.cuh"
#include "kernels/rms_norm.h"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 256;

__device__ float ToFloat(float v) {
  return v;
}
__device__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ T FromFloat(float v);
template <>
__device__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

// One block per row: sum of squares reduced in shared memory, then the scaled write.
template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, int64_t n,
                              float eps) {
  const T* xr = x + blockIdx.x * n;
  T* outr = out + blockIdx.x * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = ToFloat(xr[i]);
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum<kThreads>(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    outr[i] = FromFloat<T>(ToFloat(weight[i]) * (ToFloat(xr[i]) * inv));
  }
}

template <typename T>
cudaError_t Launch(const T* x, const T* weight, T* out, int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  RmsNormKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, out, n, eps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t RmsNormBf16(const __nv_bfloat16* x, const __nv_bfloat16* weight, __nv_bfloat16* out, int64_t rows,
                        int64_t n, float eps, cudaStream_t stream) {
  return Launch(x, weight, out, rows, n, eps, stream);
}

cudaError_t RmsNormF32(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps,
                       cudaStream_t stream) {
  return Launch(x, weight, out, rows, n, eps, stream);
}

}  // namespace inferd::kernels

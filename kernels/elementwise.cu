#include "kernels/block_reduce.cuh"
#include "kernels/elementwise.h"

namespace inferd::kernels {
namespace {

__device__ __forceinline__ float F(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float F(__half v) {
  return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T To(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 To<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half To<__half>(float v) {
  return __float2half(v);
}
// Rounds through T, as a tensor of dtype T would.
template <typename T>
__device__ __forceinline__ float Round(float v) {
  return F(To<T>(v));
}

cudaError_t Check(int64_t rows) {
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  return cudaSuccess;
}

template <typename T>
__global__ void GatherRowsKernel(const T* __restrict__ src, const int32_t* __restrict__ rows, T* __restrict__ dst,
                                 int64_t cols) {
  const T* s = src + int64_t{rows[blockIdx.x]} * cols;
  T* d = dst + int64_t{blockIdx.x} * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
}

constexpr int kNormThreads = 256;

template <typename T>
__global__ void AddRmsNormKernel(T* __restrict__ residual, const T* __restrict__ delta, const T* __restrict__ weight,
                                 T* __restrict__ out, int64_t n, float eps) {
  T* x = residual + int64_t{blockIdx.x} * n;
  const T* d = delta ? delta + int64_t{blockIdx.x} * n : nullptr;
  T* o = out + int64_t{blockIdx.x} * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    float v = F(x[i]);
    if (d) {
      v = Round<T>(v + F(d[i]));
      x[i] = To<T>(v);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum<kNormThreads>(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) o[i] = To<T>(F(weight[i]) * Round<T>(F(x[i]) * inv));
}

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t inter) {
  const T* g = gate_up + int64_t{blockIdx.x} * 2 * inter;
  T* o = out + int64_t{blockIdx.x} * inter;
  for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) {
    const float x = F(g[i]);
    o[i] = To<T>(Round<T>(x / (1.f + expf(-x))) * F(g[inter + i]));
  }
}

// One block per token; thread j of the block handles rotary pair j of every q and k head, then copies K and V.
template <typename T>
__global__ void RopeWriteKvKernel(T* __restrict__ qkv, const int32_t* __restrict__ positions,
                                  const int32_t* __restrict__ slots, const float* __restrict__ inv_freq,
                                  T* __restrict__ k_cache, T* __restrict__ v_cache, int32_t num_heads,
                                  int32_t num_kv_heads, int32_t head_dim) {
  const int64_t t = blockIdx.x;
  const int32_t half = head_dim / 2;
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  T* row = qkv + t * (int64_t{num_heads} * head_dim + 2 * kv_dim);
  const float pos = static_cast<float>(positions[t]);
  for (int32_t j = threadIdx.x; j < half; j += blockDim.x) {
    const float angle = pos * inv_freq[j];
    const float c = Round<T>(cosf(angle)), s = Round<T>(sinf(angle));
    for (int32_t h = 0; h < num_heads + num_kv_heads; ++h) {
      T* v = row + int64_t{h} * head_dim;
      const float a = F(v[j]), b = F(v[j + half]);
      v[j] = To<T>(a * c - b * s);
      v[j + half] = To<T>(b * c + a * s);
    }
  }
  __syncthreads();
  const int64_t slot = slots[t];
  const T* k = row + int64_t{num_heads} * head_dim;
  const T* v = k + kv_dim;
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    k_cache[slot * kv_dim + i] = k[i];
    v_cache[slot * kv_dim + i] = v[i];
  }
}

}  // namespace

template <typename T>
cudaError_t GatherRows(const T* src, const int32_t* rows, T* dst, int64_t num_rows, int64_t cols, cudaStream_t stream) {
  if (num_rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(num_rows); e != cudaSuccess) return e;
  GatherRowsKernel<T><<<static_cast<unsigned>(num_rows), 256, 0, stream>>>(src, rows, dst, cols);
  return cudaGetLastError();
}

template <typename T>
cudaError_t AddRmsNorm(T* residual, const T* delta, const T* weight, T* out, int64_t rows, int64_t n, float eps,
                       cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(rows); e != cudaSuccess) return e;
  AddRmsNormKernel<T><<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(residual, delta, weight, out, n, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SiluMul(const T* gate_up, T* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(rows); e != cudaSuccess) return e;
  SiluMulKernel<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(gate_up, out, inter);
  return cudaGetLastError();
}

template <typename T>
cudaError_t RopeWriteKv(T* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq, T* k_cache,
                        T* v_cache, int64_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                        cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  if (head_dim % 2 != 0) return cudaErrorInvalidValue;
  if (cudaError_t e = Check(num_tokens); e != cudaSuccess) return e;
  RopeWriteKvKernel<T><<<static_cast<unsigned>(num_tokens), 128, 0, stream>>>(
      qkv, positions, slots, inv_freq, k_cache, v_cache, num_heads, num_kv_heads, head_dim);
  return cudaGetLastError();
}

#define INFERD_INSTANTIATE(T)                                                                                     \
  template cudaError_t GatherRows<T>(const T*, const int32_t*, T*, int64_t, int64_t, cudaStream_t);               \
  template cudaError_t AddRmsNorm<T>(T*, const T*, const T*, T*, int64_t, int64_t, float, cudaStream_t);          \
  template cudaError_t SiluMul<T>(const T*, T*, int64_t, int64_t, cudaStream_t);                                  \
  template cudaError_t RopeWriteKv<T>(T*, const int32_t*, const int32_t*, const float*, T*, T*, int64_t, int32_t, \
                                      int32_t, int32_t, cudaStream_t);
INFERD_INSTANTIATE(__nv_bfloat16)
INFERD_INSTANTIATE(__half)
#undef INFERD_INSTANTIATE

}  // namespace inferd::kernels

// Conversions between the activation dtypes (bf16, fp16) and fp32 shared by the kernels (device code only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace inferd::kernels {

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
template <>
__device__ __forceinline__ float To<float>(float v) {
  return v;
}
// Two values of T in one 32-bit register (16-byte loads hold four), and both in fp32.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ float2 ToFloat2(type v) { return __bfloat1622float2(v); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ float2 ToFloat2(type v) { return __half22float2(v); }
};

// Rounds through T, as a tensor of dtype T would.
template <typename T>
__device__ __forceinline__ float Round(float v) {
  return F(To<T>(v));
}

// A gated MLP's activation of the gate, in fp32 (GatedActivation: kernels/elementwise.h).
template <int kActivation>
__device__ __forceinline__ float Activate(float x) {
  if constexpr (kActivation == 0) {
    return x / (1.f + expf(-x));  // SiLU
  } else {                        // GELU, tanh approximation (PyTorch's approximate='tanh')
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
}

}  // namespace inferd::kernels

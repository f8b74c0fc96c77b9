// Rounding to e4m3 with a per-row scale, shared by the kernels that quantize activations (device code only; the
// format: kernels/fp8.h).
#pragma once

#include <cuda_fp8.h>

#include "kernels/block_reduce.cuh"
#include "kernels/fp8.h"

namespace inferd::kernels {

// A row's scale from its largest magnitude: 1 for a row of zeros.
__device__ __forceinline__ float ScaleFor(float amax) {
  return amax > 0.f ? amax / kFp8Max : 1.f;
}

__device__ __forceinline__ Fp8 Quantize(float v, float scale) {
  Fp8 q;
  q.__x = __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
  return q;
}

// A row of n values, value(i) each, quantized by one block of kThreads in two passes (the largest magnitude, then
// the values again) into q[0, n) and *scale. Every thread of the block takes part.
template <int kThreads, typename Value>
__device__ __forceinline__ void QuantizeRowOf(Value value, int64_t n, Fp8* __restrict__ q, float* __restrict__ scale) {
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) amax = fmaxf(amax, fabsf(value(i)));
  const float s = ScaleFor(BlockMax<kThreads>(amax));
  for (int64_t i = threadIdx.x; i < n; i += kThreads) q[i] = Quantize(value(i), s);
  if (threadIdx.x == 0) *scale = s;
}

}  // namespace inferd::kernels

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

// A thread's vectors of 8 values, v[j] the row's vector first + j · stride (those below nv), rounded by scale s into
// the row's e4m3 values q, 8 bytes at a time (q 8-byte aligned).
template <int kVecs>
__device__ __forceinline__ void StoreQuantizedVecs(const float (&v)[kVecs][8], float s, int64_t first, int64_t stride,
                                                   int64_t nv, Fp8* __restrict__ q) {
  uint2* o = reinterpret_cast<uint2*>(q);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = first + int64_t{j} * stride;
    if (i >= nv) break;
    uint2 ov;
    Fp8* oe = reinterpret_cast<Fp8*>(&ov);
#pragma unroll
    for (int e = 0; e < 8; ++e) oe[e] = Quantize(v[j][e], s);
    o[i] = ov;
  }
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

// The same for a row of n values, n a multiple of 8 and at most kVecs · 8 · kThreads, read once: load(i, v) fills
// v[0, 8) with the values of the row's i-th vector of 8, each thread keeps its vectors in registers between the
// largest magnitude and the quantized values (stored 8 bytes at a time; q 8-byte aligned). Bit for bit
// QuantizeRowOf's result, with fewer, wider loads in flight at once.
template <int kThreads, int kVecs, typename Load>
__device__ __forceinline__ void QuantizeVecRowOf(Load load, int64_t n, Fp8* __restrict__ q, float* __restrict__ scale) {
  const int64_t nv = n / 8;
  float v[kVecs][8];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i >= nv) break;
    load(i, v[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[j][e]));
  }
  const float s = ScaleFor(BlockMax<kThreads>(amax));
  StoreQuantizedVecs(v, s, threadIdx.x, kThreads, nv, q);
  if (threadIdx.x == 0) *scale = s;
}

// The same by one warp, for rows short enough that a warp a row keeps more of them in flight on an SM than a block a
// row does (each row a chain of dependent loads and a reduction): lanes take every 32nd value; bit for bit
// QuantizeRowOf's result (the largest magnitude does not depend on the order it is taken in).
template <typename Value>
__device__ __forceinline__ void WarpQuantizeRowOf(Value value, int64_t n, Fp8* __restrict__ q,
                                                  float* __restrict__ scale) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  float amax = 0.f;
  for (int64_t i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(value(i)));
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, offset));
  const float s = ScaleFor(amax);
  for (int64_t i = lane; i < n; i += 32) q[i] = Quantize(value(i), s);
  if (lane == 0) *scale = s;
}

// WarpQuantizeRowOf for rows of n a multiple of 8 and at most kVecs · 8 · 32, read once: load(i, v) fills v[0, 8)
// with the row's i-th vector of 8, lane l takes vectors l, l + 32, ... and keeps them in registers between the largest
// magnitude and the quantized values (stored 8 bytes at a time; q 8-byte aligned). Bit for bit WarpQuantizeRowOf's
// result, each value computed once.
template <int kVecs, typename Load>
__device__ __forceinline__ void WarpQuantizeVecRowOf(Load load, int64_t n, Fp8* __restrict__ q,
                                                     float* __restrict__ scale) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t nv = n / 8;
  float v[kVecs][8];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = lane + int64_t{j} * 32;
    if (i >= nv) break;
    load(i, v[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[j][e]));
  }
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, offset));
  const float s = ScaleFor(amax);
  StoreQuantizedVecs(v, s, lane, 32, nv, q);
  if (lane == 0) *scale = s;
}

}  // namespace inferd::kernels

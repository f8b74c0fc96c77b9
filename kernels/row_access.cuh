// Row access shared by the kernels (device code only): the weight-streaming load, and the residual update and
// output of the vectorised RMS norms (AddRmsNorm, AddRmsNormFp8, the peer all-reduce fused with them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/fp8_convert.cuh"

namespace inferd::kernels {

// A 16-byte load of a weight read once: it bypasses L1 so the rows of X stay there.
__device__ __forceinline__ uint4 LoadOnce(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One block's row of the residual stream, kVecs vectors of 8 per thread at most (n % 8 == 0, n ≤ kThreads · kVecs
// · 8): residual += delta (rounded to T, written back; delta may be null), its values into v, and the thread's
// sum of their squares returned.
template <typename T, int kThreads, int kVecs>
__device__ __forceinline__ float AddResidualRow(T* __restrict__ residual, const T* __restrict__ delta, int64_t n,
                                                float (&v)[kVecs][8]) {
  const int64_t nv = n / 8;
  uint4* x = reinterpret_cast<uint4*>(residual + int64_t{blockIdx.x} * n);
  const uint4* d = delta ? reinterpret_cast<const uint4*>(delta + int64_t{blockIdx.x} * n) : nullptr;
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i >= nv) break;
    uint4 xv = x[i];
    T* xe = reinterpret_cast<T*>(&xv);
    if (d) {
      const uint4 dv = d[i];
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) xe[e] = To<T>(F(xe[e]) + F(de[e]));
      x[i] = xv;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[j][e] = F(xe[e]);
      ss += v[j][e] * v[j][e];
    }
  }
  return ss;
}

// The normed row out of a block's v (its residual row's values, up to kVecs vectors of 8 per thread as
// AddResidualRow leaves them; inv = 1 / rms): weight ⊙ (v · inv rounded to T), rounded to T, into out_row.
template <typename T, int kThreads, int kVecs>
__device__ __forceinline__ void StoreNormedRow(const float (&v)[kVecs][8], float inv, const T* __restrict__ weight,
                                               T* __restrict__ out_row, int64_t n) {
  const int64_t nv = n / 8;
  uint4* o = reinterpret_cast<uint4*>(out_row);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i >= nv) break;
    const uint4 wv = w[i];
    const T* we = reinterpret_cast<const T*>(&wv);
    uint4 ov;
    T* oe = reinterpret_cast<T*>(&ov);
#pragma unroll
    for (int e = 0; e < 8; ++e) oe[e] = To<T>(F(we[e]) * Round<T>(v[j][e] * inv));
    o[i] = ov;
  }
}

// The same row, rounded to T as there, quantized per row to e4m3 into q_row and *scale (every thread of the block
// takes part: a block-wide maximum). v is overwritten.
template <typename T, int kThreads, int kVecs>
__device__ __forceinline__ void QuantizeNormedRow(float (&v)[kVecs][8], float inv, const T* __restrict__ weight,
                                                  Fp8* __restrict__ q_row, float* __restrict__ scale, int64_t n) {
  const int64_t nv = n / 8;
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i >= nv) break;
    const uint4 wv = w[i];
    const T* we = reinterpret_cast<const T*>(&wv);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[j][e] = Round<T>(F(we[e]) * Round<T>(v[j][e] * inv));
      amax = fmaxf(amax, fabsf(v[j][e]));
    }
  }
  const float s = ScaleFor(BlockMax<kThreads>(amax));
  StoreQuantizedVecs(v, s, threadIdx.x, kThreads, nv, q_row);
  if (threadIdx.x == 0) *scale = s;
}

}  // namespace inferd::kernels

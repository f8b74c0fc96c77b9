// The weight-streaming products' inner loop, shared by the dense decode products (gemv.cu) and the experts'
// (moe_products.cu), so that both sum in one order and the fused kernels equal the plain ones bit for bit
// (device code only). A warp computes R rows of W against M rows of X: lane l takes W's 16-byte chunks l, l + 32,
// l + 64, … of each row, in that order, fp32 accumulation; then the lanes' sums meet in a butterfly. W, the
// weights' element, is T (a chunk holds 8 weights) or e4m3 (16: kernels/fp8.h, whose products scale the sums).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/float_convert.cuh"
#include "kernels/fp8.h"
#include "kernels/row_access.cuh"

namespace inferd::kernels {

inline constexpr int kGemvInFlight = 8;  // 16-byte loads of W in flight per lane

// acc[j][r] += W row j's chunk (8 values) · X row r's chunk, for the R rows of W and M rows of X (k apart) at
// chunk c.
template <typename T, int M, int R>
__device__ __forceinline__ void Accumulate(const uint4 (&wv)[R], const T* __restrict__ x, int64_t k, int64_t c,
                                           float (&acc)[R][M]) {
  using P = Pair<T>;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + r * k) + c);
    const auto* xp = reinterpret_cast<const typename P::type*>(&xv);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const auto* wp = reinterpret_cast<const typename P::type*>(&wv[j]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 xf = P::ToFloat2(xp[i]);
        const float2 wf = P::ToFloat2(wp[i]);
        acc[j][r] = fmaf(wf.x, xf.x, fmaf(wf.y, xf.y, acc[j][r]));
      }
    }
  }
}

__device__ __forceinline__ float2 Fp8PairToFloat2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Accumulate's e4m3 weights: chunk c of a W row is 16 weights, matched by two 16-byte chunks of each X row.
template <typename T, int M, int R>
__device__ __forceinline__ void AccumulateFp8(const uint4 (&wv)[R], const T* __restrict__ x, int64_t k, int64_t c,
                                              float (&acc)[R][M]) {
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + r * k) + 2 * c;
    uint4 xv[2] = {__ldg(xr), __ldg(xr + 1)};
    float xf[16];
    const T* xe = reinterpret_cast<const T*>(xv);
#pragma unroll
    for (int e = 0; e < 16; ++e) xf[e] = F(xe[e]);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const uint16_t* wp = reinterpret_cast<const uint16_t*>(&wv[j]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 wf = Fp8PairToFloat2(wp[i]);
        acc[j][r] = fmaf(wf.x, xf[2 * i], fmaf(wf.y, xf[2 * i + 1], acc[j][r]));
      }
    }
  }
}

template <typename W>
inline constexpr bool kFp8Weights = std::is_same_v<W, Fp8>;

// Weights a 16-byte chunk holds.
template <typename W>
inline constexpr int kChunkWeights = kFp8Weights<W> ? 16 : 8;

template <typename T, typename W, int M, int R>
__device__ __forceinline__ void AccumulateChunk(const uint4 (&wv)[R], const T* __restrict__ x, int64_t k, int64_t c,
                                                float (&acc)[R][M]) {
  if constexpr (kFp8Weights<W>) {
    AccumulateFp8<T, M, R>(wv, x, k, c, acc);
  } else {
    Accumulate<T, M, R>(wv, x, k, c, acc);
  }
}

// The lane's whole share of the R rows of W (wr[j] their first chunks, k / kChunkWeights<W> chunks each) against
// X, in batches of kGemvInFlight loads issued before any is used; the last batch's loads past the row are not made.
template <typename T, int M, int R, int kLoads = kGemvInFlight, typename W = T>
__device__ __forceinline__ void StreamDot(const uint4* const (&wr)[R], const T* __restrict__ x, int64_t k, int lane,
                                          float (&acc)[R][M]) {
  constexpr int kSteps = kLoads / R >= 1 ? kLoads / R : 1;
  const int64_t chunks = k / kChunkWeights<W>;
  for (int64_t c = lane; c < chunks; c += kSteps * 32) {
    uint4 wv[kSteps][R];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (c + u * 32 < chunks) {
#pragma unroll
        for (int j = 0; j < R; ++j) wv[u][j] = LoadOnce(wr[j] + c + u * 32);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (c + u * 32 < chunks) AccumulateChunk<T, W, M, R>(wv[u], x, k, c + u * 32, acc);
    }
  }
}

// Two such products at once (two experts' rows against their own X), their loads interleaved: twice the loads in
// flight, each product's sums in StreamDot's order.
template <typename T, int R, typename W = T>
__device__ __forceinline__ void StreamDotPair(const uint4* const (&wa)[R], const T* __restrict__ xa,
                                              float (&acc_a)[R][1], const uint4* const (&wb)[R],
                                              const T* __restrict__ xb, float (&acc_b)[R][1], int64_t k, int lane) {
  constexpr int kSteps = kGemvInFlight / R >= 1 ? kGemvInFlight / R : 1;
  const int64_t chunks = k / kChunkWeights<W>;
  for (int64_t c = lane; c < chunks; c += kSteps * 32) {
    uint4 va[kSteps][R], vb[kSteps][R];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (c + u * 32 < chunks) {
#pragma unroll
        for (int j = 0; j < R; ++j) va[u][j] = LoadOnce(wa[j] + c + u * 32);
#pragma unroll
        for (int j = 0; j < R; ++j) vb[u][j] = LoadOnce(wb[j] + c + u * 32);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (c + u * 32 < chunks) {
        AccumulateChunk<T, W, 1, R>(va[u], xa, k, c + u * 32, acc_a);
        AccumulateChunk<T, W, 1, R>(vb[u], xb, k, c + u * 32, acc_b);
      }
    }
  }
}

// Every lane's acc becomes the warp's sum.
template <int M, int R>
__device__ __forceinline__ void WarpSum(float (&acc)[R][M]) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      for (int off = 16; off > 0; off /= 2) acc[j][r] += __shfl_xor_sync(0xffffffff, acc[j][r], off);
    }
  }
}

// A gated MLP's output element from its gate and up sums: each rounded to T as a plain product's output is, then
// act(gate) rounded and times up, rounded (as ActivateMul of kernels/elementwise.h).
template <typename T, int kActivation>
__device__ __forceinline__ T GatedValue(float gate_sum, float up_sum) {
  const float gate = F(To<T>(gate_sum + 0.f));  // + 0.f: the plain product's bias-less rounding
  const float up = F(To<T>(up_sum + 0.f));
  return To<T>(Round<T>(Activate<kActivation>(gate)) * up);
}

}  // namespace inferd::kernels

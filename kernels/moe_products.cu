#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/dependent_launch.cuh"
#include "kernels/moe_products.h"
#include "kernels/row_access.cuh"

namespace inferd::kernels {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kCols = 2;   // W rows (output columns) per warp
constexpr int kPass = 8;   // X rows per pass over an expert's weights

__device__ __forceinline__ float2 ToFloat2(__nv_bfloat162 v) {
  return __bfloat1622float2(v);
}
__device__ __forceinline__ float2 ToFloat2(__half2 v) {
  return __half22float2(v);
}
template <typename T>
using Pair2 = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
__device__ __forceinline__ __nv_bfloat16 Round(float v, __nv_bfloat16*) {
  return __float2bfloat16(v);
}
__device__ __forceinline__ __half Round(float v, __half*) {
  return __float2half(v);
}

// One warp, M rows of X against its kCols rows of W: the lanes sweep k in 16-byte chunks.
template <typename T, int M>
__device__ __forceinline__ void Rows(const T* __restrict__ x, const uint4* const (&wr)[kCols], T* __restrict__ y,
                                     int64_t col0, int64_t n, int64_t k, int lane) {
  float acc[kCols][M] = {};
  for (int64_t c = lane; c < k / 8; c += 32) {
    uint4 wv[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) wv[j] = LoadOnce(wr[j] + c);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + r * k) + c);
      const auto* xp = reinterpret_cast<const Pair2<T>*>(&xv);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const auto* wp = reinterpret_cast<const Pair2<T>*>(&wv[j]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 xf = ToFloat2(xp[i]), wf = ToFloat2(wp[i]);
          acc[j][r] = fmaf(wf.x, xf.x, fmaf(wf.y, xf.y, acc[j][r]));
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      for (int off = 16; off > 0; off /= 2) acc[j][r] += __shfl_xor_sync(0xffffffff, acc[j][r], off);
      if (lane == (j * M + r) % 32 && col0 + j < n) y[r * n + col0 + j] = Round(acc[j][r], static_cast<T*>(nullptr));
    }
  }
}

// Rows<T, m> for a pass's m rows (1 <= m <= M), the row count a compile-time constant in each.
template <typename T, int M>
__device__ __forceinline__ void RowsOf(int m, const T* __restrict__ x, const uint4* const (&wr)[kCols],
                                       T* __restrict__ y, int64_t col0, int64_t n, int64_t k, int lane) {
  if constexpr (M > 1) {
    if (m < M) return RowsOf<T, M - 1>(m, x, wr, y, col0, n, k, lane);
  }
  Rows<T, M>(x, wr, y, col0, n, k, lane);
}

// Block (column tile, expert): the expert's run in passes of up to kPass rows; experts no row chose return at once.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    ExpertGemvKernel(const T* __restrict__ x, const T* __restrict__ w, const int32_t* __restrict__ offsets, T* y,
                     int64_t n, int64_t k) {
  WaitForPrerequisites();  // the runs are MoeRoute's, the rows the gather's
  const int64_t e = blockIdx.y;
  const int64_t begin = offsets[e], end = offsets[e + 1];
  if (begin == end) return;
  const int lane = threadIdx.x % 32;
  const int64_t col0 = (int64_t{blockIdx.x} * kWarps + threadIdx.x / 32) * kCols;
  if (col0 >= n) return;
  const T* we = w + e * n * k;
  const uint4* wr[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) wr[j] = reinterpret_cast<const uint4*>(we + std::min(col0 + j, n - 1) * k);
  for (int64_t r0 = begin; r0 < end; r0 += kPass) {
    const T* xr = x + r0 * k;
    T* yr = y + r0 * n;
    RowsOf<T, kPass>(static_cast<int>(std::min<int64_t>(kPass, end - r0)), xr, wr, yr, col0, n, k, lane);
  }
}

}  // namespace

template <typename T>
cudaError_t MoeExpertGemv(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                          cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t tiles = (n + kWarps * kCols - 1) / (kWarps * kCols);
  if (experts < 1 || experts > 65535 || n < 1 || k < 8 || k % 8 != 0 || !aligned(x) || !aligned(w) ||
      tiles > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  return LaunchDependent(ExpertGemvKernel<T>, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(experts)),
                         kWarps * 32, stream, x, w, offsets, y, n, k);
}

template cudaError_t MoeExpertGemv(const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int32_t, __nv_bfloat16*,
                                   int64_t, int64_t, cudaStream_t);
template cudaError_t MoeExpertGemv(const __half*, const __half*, const int32_t*, int32_t, __half*, int64_t, int64_t,
                                   cudaStream_t);

}  // namespace inferd::kernels

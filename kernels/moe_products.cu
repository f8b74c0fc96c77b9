#include <mma.h>

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

// The grouped product's tile: 64 rows of a run by 128 weight rows, k in steps of 32; 8 warps, each 32 x 32 (2 x 2
// fragments of 16 x 16 x 16). Tiles go through shared memory, rows padded by 8 elements against bank conflicts; the
// fp32 results go out through shared memory too (over the operands' space), so that rows past the run's end and
// columns past n are not written.
constexpr int kTileM = 64, kTileN = 128, kTileK = 32, kTilePad = 8, kGemmThreads = 256;
constexpr int kOperandStride = kTileK + kTilePad;  // elements
constexpr int kOutStride = 32 + 4;                 // floats, per warp's 32 x 32 tile

template <typename T>
__global__ void __launch_bounds__(kGemmThreads)
    ExpertGemmKernel(const T* __restrict__ x, const T* __restrict__ w, const int32_t* __restrict__ offsets,
                     int32_t experts, T* __restrict__ y, int64_t n, int64_t k) {
  namespace wmma = nvcuda::wmma;
  constexpr int kOperandBytes = (kTileM + kTileN) * kOperandStride * sizeof(T);
  constexpr int kOutBytes = (kGemmThreads / 32) * 32 * kOutStride * sizeof(float);
  __shared__ alignas(128) unsigned char smem[kOperandBytes > kOutBytes ? kOperandBytes : kOutBytes];
  T* as = reinterpret_cast<T*>(smem);
  T* bs = as + kTileM * kOperandStride;
  WaitForPrerequisites();  // the runs are MoeRoute's, the rows the gather's
  // This block's expert and tile of its run: tiles are numbered expert by expert.
  int32_t tile = static_cast<int32_t>(blockIdx.y), e = 0, begin = 0, count = 0;
  for (; e < experts; ++e) {
    begin = offsets[e];
    count = offsets[e + 1] - begin;
    const int32_t tiles = (count + kTileM - 1) / kTileM;
    if (tile < tiles) break;
    tile -= tiles;
  }
  if (e == experts) return;
  const int64_t row0 = begin + int64_t{tile} * kTileM;
  const int32_t rows = static_cast<int32_t>(std::min<int64_t>(kTileM, begin + count - row0));
  const int64_t col0 = int64_t{blockIdx.x} * kTileN;
  const T* we = w + int64_t{e} * n * k;
  const int warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    // 16-byte pieces: the rows' 64 x 32 (one a thread), the weights' 128 x 32 (two); zeros past the run and n.
    for (int i = threadIdx.x; i < (kTileM + kTileN) * kTileK / 8; i += kGemmThreads) {
      const int r = i / (kTileK / 8), c = (i % (kTileK / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < kTileM) {
        if (r < rows) v = __ldg(reinterpret_cast<const uint4*>(x + (row0 + r) * k + k0 + c));
        *reinterpret_cast<uint4*>(as + r * kOperandStride + c) = v;
      } else {
        const int64_t col = col0 + (r - kTileM);
        if (col < n) v = LoadOnce(reinterpret_cast<const uint4*>(we + col * k + k0 + c));
        *reinterpret_cast<uint4*>(bs + (r - kTileM) * kOperandStride + c) = v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(a[i], as + (wm * 32 + i * 16) * kOperandStride + kk, kOperandStride);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(b[j], bs + (wn * 32 + j * 16) * kOperandStride + kk, kOperandStride);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* out = reinterpret_cast<float*>(smem) + warp * 32 * kOutStride;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(out + i * 16 * kOutStride + j * 16, acc[i][j], kOutStride, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < 32 * 32; idx += 32) {
    const int r = wm * 32 + idx / 32;
    const int64_t col = col0 + wn * 32 + idx % 32;
    if (r < rows && col < n)
      y[(row0 + r) * n + col] = Round(out[(idx / 32) * kOutStride + idx % 32], static_cast<T*>(nullptr));
  }
}

}  // namespace

bool MoeExpertGemmSupports(const void* x, const void* w, int64_t n, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n >= 1 && k >= kTileK && k % kTileK == 0 && aligned(x) && aligned(w) &&
         (n + kTileN - 1) / kTileN <= 0x7fffffff;
}

template <typename T>
cudaError_t MoeExpertGemm(const T* x, const T* w, const int32_t* offsets, int32_t experts, int64_t max_slots, T* y,
                          int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t row_tiles = (max_slots + kTileM - 1) / kTileM + experts;  // a partial tile per expert at most
  if (experts < 1 || max_slots < 1 || row_tiles > 65535 || !MoeExpertGemmSupports(x, w, n, k)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN), static_cast<unsigned>(row_tiles));
  return LaunchDependent(ExpertGemmKernel<T>, grid, kGemmThreads, stream, x, w, offsets, experts, y, n, k);
}

template cudaError_t MoeExpertGemm(const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int32_t, int64_t,
                                   __nv_bfloat16*, int64_t, int64_t, cudaStream_t);
template cudaError_t MoeExpertGemm(const __half*, const __half*, const int32_t*, int32_t, int64_t, __half*, int64_t,
                                   int64_t, cudaStream_t);

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

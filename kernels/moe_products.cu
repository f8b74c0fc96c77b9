#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "kernels/dependent_launch.cuh"
#include "kernels/gemv_rows.cuh"
#include "kernels/moe_products.h"

namespace inferd::kernels {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kCols = 2;   // W rows (output columns) per warp
constexpr int kPass = 8;   // X rows per pass over an expert's weights

// A product's output from its sum: as it is for 16-bit weights, times the weight row's scale for e4m3 ones
// (kernels/fp8.h: w_scale[row], rows counted over every expert's; w_scale is not read for 16-bit weights).
template <typename W>
__device__ __forceinline__ float Scaled(float sum, const float* __restrict__ w_scale, int64_t row) {
  if constexpr (kFp8Weights<W>) {
    return sum * w_scale[row];
  } else {
    return sum;
  }
}

// One warp, M rows of X against its kCols rows of W (gemv_rows.cuh's order of sums), rounded once into Y. One
// chunk of each W row in flight per lane: with more (StreamDot's 8), the kernel took 96 registers where it takes
// 72, and batches of 64 and 128 rows ran 12% and 7% slower (H100, Qwen3-30B-A3B's shape).
template <typename T, typename W, int M>
__device__ __forceinline__ void Rows(const T* __restrict__ x, const uint4* const (&wr)[kCols],
                                     const float* __restrict__ w_scale, int64_t scale_row0, T* __restrict__ y,
                                     int64_t col0, int64_t n, int64_t k, int lane) {
  float acc[kCols][M] = {};
  StreamDot<T, M, kCols, /*kLoads=*/kCols, W>(wr, x, k, lane, acc);
  WarpSum<M, kCols>(acc);
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (lane == (j * M + r) % 32 && col0 + j < n)
        y[r * n + col0 + j] = To<T>(Scaled<W>(acc[j][r], w_scale, scale_row0 + col0 + j));
    }
  }
}

// Rows<T, m> for a pass's m rows (1 <= m <= M), the row count a compile-time constant in each.
template <typename T, typename W, int M>
__device__ __forceinline__ void RowsOf(int m, const T* __restrict__ x, const uint4* const (&wr)[kCols],
                                       const float* __restrict__ w_scale, int64_t scale_row0, T* __restrict__ y,
                                       int64_t col0, int64_t n, int64_t k, int lane) {
  if constexpr (M > 1) {
    if (m < M) return RowsOf<T, W, M - 1>(m, x, wr, w_scale, scale_row0, y, col0, n, k, lane);
  }
  Rows<T, W, M>(x, wr, w_scale, scale_row0, y, col0, n, k, lane);
}

// Block (column tile, expert): the expert's run in passes of up to kPass rows; experts no row chose return at once.
// w_scale: [experts, n] for e4m3 weights, else unused.
template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * 32)
    ExpertGemvKernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ w_scale,
                     const int32_t* __restrict__ offsets, T* y, int64_t n, int64_t k) {
  WaitForPrerequisites();  // the runs are MoeRoute's, the rows the gather's
  const int64_t e = blockIdx.y;
  const int64_t begin = offsets[e], end = offsets[e + 1];
  if (begin == end) return;
  const int lane = threadIdx.x % 32;
  const int64_t col0 = (int64_t{blockIdx.x} * kWarps + threadIdx.x / 32) * kCols;
  if (col0 >= n) return;
  const W* we = w + e * n * k;
  const uint4* wr[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) wr[j] = reinterpret_cast<const uint4*>(we + std::min(col0 + j, n - 1) * k);
  for (int64_t r0 = begin; r0 < end; r0 += kPass) {
    RowsOf<T, W, kPass>(static_cast<int>(std::min<int64_t>(kPass, end - r0)), x + r0 * k, wr, w_scale, e * n,
                        y + r0 * n, col0, n, k, lane);
  }
}

// Per row's slot, the gate/up products, block (column tile, slot s = row · top_k + j): expert ids[s]'s gate row i
// and up row inter + i against x's row s / top_k (a warp a column i), act(gate) · up into out[s, i].
template <typename T, typename W, int kActivation>
__global__ void __launch_bounds__(kWarps * 32)
    RowGatedKernel(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ w_scale,
                   const int32_t* __restrict__ ids, int32_t top_k, T* __restrict__ out, int64_t inter, int64_t k) {
  WaitForPrerequisites();  // the experts are MoeTopK's
  const int64_t slot = blockIdx.y;
  const int64_t i = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (i >= inter) return;
  const int lane = threadIdx.x % 32;
  const int64_t e = ids[slot];
  const W* we = w + e * 2 * inter * k;
  const uint4* wr[2] = {reinterpret_cast<const uint4*>(we + i * k),
                        reinterpret_cast<const uint4*>(we + (inter + i) * k)};
  float acc[2][1] = {};
  StreamDot<T, 1, 2, kGemvInFlight, W>(wr, x + slot / top_k * k, k, lane, acc);
  WarpSum<1, 2>(acc);
  if (lane == 0) {
    const int64_t row0 = e * 2 * inter;  // the expert's first weight row
    out[slot * inter + i] = GatedValue<T, kActivation>(Scaled<W>(acc[0][0], w_scale, row0 + i),
                                                       Scaled<W>(acc[1][0], w_scale, row0 + inter + i));
  }
}

// Per row, its slots' down products and their weighted sum, block (column tile, row): per column, each slot's
// product rounded to T, weighted and added in slot order (fp32, rounded once), as MoeExpertGemv then MoeCombine.
template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * 32)
    RowDownCombineKernel(const T* __restrict__ act, const W* __restrict__ w, const float* __restrict__ w_scale,
                         const int32_t* __restrict__ ids, const float* __restrict__ weights, int32_t top_k,
                         T* __restrict__ out, int64_t n, int64_t k) {
  WaitForPrerequisites();  // the activations are RowGatedKernel's
  const int64_t col0 = (int64_t{blockIdx.x} * kWarps + threadIdx.x / 32) * kCols;
  if (col0 >= n) return;
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.y;
  float total[kCols] = {};
  int64_t j = row * top_k;
  for (; j + 1 < (row + 1) * top_k; j += 2) {  // two slots at a time: twice the loads in flight
    const int64_t ea = ids[j], eb = ids[j + 1];
    const W* wa = w + ea * n * k;
    const W* wb = w + eb * n * k;
    const uint4 *ra[kCols], *rb[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      ra[c] = reinterpret_cast<const uint4*>(wa + std::min(col0 + c, n - 1) * k);
      rb[c] = reinterpret_cast<const uint4*>(wb + std::min(col0 + c, n - 1) * k);
    }
    float acc_a[kCols][1] = {}, acc_b[kCols][1] = {};
    StreamDotPair<T, kCols, W>(ra, act + j * k, acc_a, rb, act + (j + 1) * k, acc_b, k, lane);
    WarpSum<1, kCols>(acc_a);
    WarpSum<1, kCols>(acc_b);
    const float weight_a = weights[j], weight_b = weights[j + 1];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int64_t col = std::min(col0 + c, n - 1);
      total[c] = fmaf(weight_a, Round<T>(Scaled<W>(acc_a[c][0], w_scale, ea * n + col)), total[c]);
      total[c] = fmaf(weight_b, Round<T>(Scaled<W>(acc_b[c][0], w_scale, eb * n + col)), total[c]);
    }
  }
  for (; j < (row + 1) * top_k; ++j) {
    const int64_t e = ids[j];
    const W* we = w + e * n * k;
    const uint4* wr[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) wr[c] = reinterpret_cast<const uint4*>(we + std::min(col0 + c, n - 1) * k);
    float acc[kCols][1] = {};
    StreamDot<T, 1, kCols, kGemvInFlight, W>(wr, act + j * k, k, lane, acc);
    WarpSum<1, kCols>(acc);
    const float weight = weights[j];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      total[c] = fmaf(weight, Round<T>(Scaled<W>(acc[c][0], w_scale, e * n + std::min(col0 + c, n - 1))), total[c]);
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if (lane == c && col0 + c < n) out[row * n + col0 + c] = To<T>(total[c]);
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
    if (r < rows && col < n) y[(row0 + r) * n + col] = To<T>(out[(idx / 32) * kOutStride + idx % 32]);
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

namespace {

// The streaming products' checks and launches for either weight type (k a multiple of a chunk's weights).
template <typename W>
bool StreamShapeOk(const void* x, const void* w, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return k >= kChunkWeights<W> && k % kChunkWeights<W> == 0 && aligned(x) && aligned(w);
}

template <typename T, typename W>
cudaError_t ExpertGemv(const T* x, const W* w, const float* w_scale, const int32_t* offsets, int32_t experts, T* y,
                       int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t tiles = (n + kWarps * kCols - 1) / (kWarps * kCols);
  if (experts < 1 || experts > 65535 || n < 1 || !StreamShapeOk<W>(x, w, k) || tiles > 0x7fffffff ||
      (kFp8Weights<W> && w_scale == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return LaunchDependent(ExpertGemvKernel<T, W>, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(experts)),
                         kWarps * 32, stream, x, w, w_scale, offsets, y, n, k);
}

template <typename T, typename W>
cudaError_t RowGatedGemv(const T* x, const W* w, const float* w_scale, const int32_t* topk_ids, int64_t rows,
                         int32_t top_k, T* out, int64_t inter, int64_t k, GatedActivation act, cudaStream_t stream) {
  if (rows < 1 || top_k < 1 || rows * top_k > 65535 || inter < 1 || !StreamShapeOk<W>(x, w, k) ||
      (inter + kWarps - 1) / kWarps > 0x7fffffff || (kFp8Weights<W> && w_scale == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((inter + kWarps - 1) / kWarps), static_cast<unsigned>(rows * top_k));
  constexpr int kSilu = static_cast<int>(GatedActivation::kSilu), kGelu = static_cast<int>(GatedActivation::kGeluTanh);
  return act == GatedActivation::kGeluTanh ? LaunchDependent(RowGatedKernel<T, W, kGelu>, grid, kWarps * 32, stream, x,
                                                             w, w_scale, topk_ids, top_k, out, inter, k)
                                           : LaunchDependent(RowGatedKernel<T, W, kSilu>, grid, kWarps * 32, stream, x,
                                                             w, w_scale, topk_ids, top_k, out, inter, k);
}

template <typename T, typename W>
cudaError_t RowDownCombine(const T* act, const W* w, const float* w_scale, const int32_t* topk_ids,
                           const float* topk_weights, int64_t rows, int32_t top_k, T* out, int64_t n, int64_t k,
                           cudaStream_t stream) {
  const int64_t tiles = (n + kWarps * kCols - 1) / (kWarps * kCols);
  if (rows < 1 || rows > 65535 || top_k < 1 || n < 1 || !StreamShapeOk<W>(act, w, k) || tiles > 0x7fffffff ||
      (kFp8Weights<W> && w_scale == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return LaunchDependent(RowDownCombineKernel<T, W>, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(rows)),
                         kWarps * 32, stream, act, w, w_scale, topk_ids, topk_weights, top_k, out, n, k);
}

}  // namespace

template <typename T>
cudaError_t MoeExpertGemv(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                          cudaStream_t stream) {
  return ExpertGemv(x, w, static_cast<const float*>(nullptr), offsets, experts, y, n, k, stream);
}
template <typename T>
cudaError_t MoeExpertGemv(const T* x, const Fp8* w, const float* w_scale, const int32_t* offsets, int32_t experts, T* y,
                          int64_t n, int64_t k, cudaStream_t stream) {
  return ExpertGemv(x, w, w_scale, offsets, experts, y, n, k, stream);
}

template <typename T>
cudaError_t MoeRowGatedGemv(const T* x, const T* w, const int32_t* topk_ids, int64_t rows, int32_t top_k, T* out,
                            int64_t inter, int64_t k, GatedActivation act, cudaStream_t stream) {
  return RowGatedGemv(x, w, static_cast<const float*>(nullptr), topk_ids, rows, top_k, out, inter, k, act, stream);
}
template <typename T>
cudaError_t MoeRowGatedGemv(const T* x, const Fp8* w, const float* w_scale, const int32_t* topk_ids, int64_t rows,
                            int32_t top_k, T* out, int64_t inter, int64_t k, GatedActivation act, cudaStream_t stream) {
  return RowGatedGemv(x, w, w_scale, topk_ids, rows, top_k, out, inter, k, act, stream);
}

template <typename T>
cudaError_t MoeRowDownCombine(const T* act, const T* w, const int32_t* topk_ids, const float* topk_weights,
                              int64_t rows, int32_t top_k, T* out, int64_t n, int64_t k, cudaStream_t stream) {
  return RowDownCombine(act, w, static_cast<const float*>(nullptr), topk_ids, topk_weights, rows, top_k, out, n, k,
                        stream);
}
template <typename T>
cudaError_t MoeRowDownCombine(const T* act, const Fp8* w, const float* w_scale, const int32_t* topk_ids,
                              const float* topk_weights, int64_t rows, int32_t top_k, T* out, int64_t n, int64_t k,
                              cudaStream_t stream) {
  return RowDownCombine(act, w, w_scale, topk_ids, topk_weights, rows, top_k, out, n, k, stream);
}

#define INFERD_MOE_STREAMING(T, W, ...)                                                                               \
  template cudaError_t MoeExpertGemv(const T*, const W*, __VA_ARGS__ const int32_t*, int32_t, T*, int64_t, int64_t,   \
                                     cudaStream_t);                                                                   \
  template cudaError_t MoeRowGatedGemv(const T*, const W*, __VA_ARGS__ const int32_t*, int64_t, int32_t, T*, int64_t, \
                                       int64_t, GatedActivation, cudaStream_t);                                       \
  template cudaError_t MoeRowDownCombine(const T*, const W*, __VA_ARGS__ const int32_t*, const float*, int64_t,       \
                                         int32_t, T*, int64_t, int64_t, cudaStream_t);
INFERD_MOE_STREAMING(__nv_bfloat16, __nv_bfloat16, )
INFERD_MOE_STREAMING(__half, __half, )
INFERD_MOE_STREAMING(__nv_bfloat16, Fp8, const float*, )
INFERD_MOE_STREAMING(__half, Fp8, const float*, )
#undef INFERD_MOE_STREAMING

}  // namespace inferd::kernels

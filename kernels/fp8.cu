#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/block_reduce.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/fp8.h"
#include "kernels/fp8_convert.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_rows.cuh"
#include "kernels/gemv_tiles.cuh"
#include "kernels/row_access.cuh"

namespace inferd::kernels {
namespace {

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// One block per row, two passes over it: the largest magnitude, then the quantized values.
constexpr int kQuantThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsKernel(const T* __restrict__ src, int64_t cols, Fp8* __restrict__ q, float* __restrict__ scales) {
  AllowDependentsToLaunch();
  WaitForPrerequisites();
  const T* s = src + int64_t{blockIdx.x} * cols;
  QuantizeRowOf<kQuantThreads>([&](int64_t i) { return F(s[i]); }, cols, q + int64_t{blockIdx.x} * cols,
                               scales + blockIdx.x);
}

// Rows of whole vectors of 8 up to kQuantVecs per thread: each read once, 16 bytes a load (attention's output rows
// before the o product; kernels/NOTES.md).
constexpr int kQuantVecs = 4;

template <typename T>
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsVecKernel(const T* __restrict__ src, int64_t cols, Fp8* __restrict__ q, float* __restrict__ scales) {
  AllowDependentsToLaunch();
  WaitForPrerequisites();
  const uint4* s = reinterpret_cast<const uint4*>(src + int64_t{blockIdx.x} * cols);
  QuantizeVecRowOf<kQuantThreads, kQuantVecs>(
      [&](int64_t i, float(&v)[8]) {
        const uint4 a = s[i];
        const T* ae = reinterpret_cast<const T*>(&a);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = F(ae[e]);
      },
      cols, q + int64_t{blockIdx.x} * cols, scales + blockIdx.x);
}

// AddRmsNormVecKernel's (kernels/elementwise.cu) arithmetic with its output quantized: each thread holds up to
// kNormVecs vectors of 8 of its row in registers (AddResidualRow), so the row is read once.
constexpr int kNormThreads = 512;
constexpr int kNormVecs = 4;

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormFp8Kernel(T* __restrict__ residual, const T* __restrict__ delta, const T* __restrict__ weight,
                        Fp8* __restrict__ q, float* __restrict__ scales, int64_t n, float eps) {
  AllowDependentsToLaunch();
  WaitForPrerequisites();
  float v[kNormVecs][8];
  const float ss = AddResidualRow<T, kNormThreads, kNormVecs>(residual, delta, n, v);
  const float inv = rsqrtf(BlockSum<kNormThreads>(ss) / static_cast<float>(n) + eps);
  QuantizeNormedRow<T, kNormThreads, kNormVecs>(v, inv, weight, q + int64_t{blockIdx.x} * n, scales + blockIdx.x, n);
}

// One block per row, two passes: SiLU(gate)·up and its largest magnitude, then again (the row is in L2 by then)
// for the quantized values.
constexpr int kSiluThreads = 1024;

template <typename T, int A>
__device__ __forceinline__ float ActivateMulAt(const T* g, int64_t inter, int64_t i) {
  return Round<T>(Round<T>(Activate<A>(F(g[i]))) * F(g[inter + i]));
}

template <typename T, int A>
__global__ void __launch_bounds__(kSiluThreads) ActivateMulFp8Kernel(const T* __restrict__ gate_up, Fp8* __restrict__ q,
                                                                     float* __restrict__ scales, int64_t inter) {
  AllowDependentsToLaunch();
  WaitForPrerequisites();
  const T* g = gate_up + int64_t{blockIdx.x} * 2 * inter;
  QuantizeRowOf<kSiluThreads>([&](int64_t i) { return ActivateMulAt<T, A>(g, inter, i); }, inter,
                              q + int64_t{blockIdx.x} * inter, scales + blockIdx.x);
}

// The same, one pass: rows of whole vectors of 8 up to kSiluVecs per thread, gate and up read 16 bytes a load and
// kept in registers (a step's 14,336-wide rows took 15 µs in two passes of 2-byte loads; kernels/NOTES.md).
constexpr int kSiluVecThreads = 512;
constexpr int kSiluVecs = 8;

template <typename T, int A>
__global__ void __launch_bounds__(kSiluVecThreads)
    ActivateMulFp8VecKernel(const T* __restrict__ gate_up, Fp8* __restrict__ q, float* __restrict__ scales,
                            int64_t inter) {
  AllowDependentsToLaunch();
  WaitForPrerequisites();
  const T* g = gate_up + int64_t{blockIdx.x} * 2 * inter;
  const uint4* gv = reinterpret_cast<const uint4*>(g);
  const uint4* uv = reinterpret_cast<const uint4*>(g + inter);
  QuantizeVecRowOf<kSiluVecThreads, kSiluVecs>(
      [&](int64_t i, float(&v)[8]) {
        const uint4 a = gv[i], b = uv[i];
        const T* ae = reinterpret_cast<const T*>(&a);
        const T* be = reinterpret_cast<const T*>(&b);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = Round<T>(Round<T>(Activate<A>(F(ae[e]))) * F(be[e]));
      },
      inter, q + int64_t{blockIdx.x} * inter, scales + blockIdx.x);
}

// The weight-streaming product with e4m3 weights: a 16-byte load is 16 weights; the matching 16 activations are
// two 16-byte loads of x per row. A block's kWarps warps share its R weight rows and split k between them
// (kernels/gemv.cu gives each warp its own rows): an fp8 row is half a bf16 row's bytes, and a warp alone on it
// would have too few loads in flight to stream at full speed (kernels/NOTES.md).
constexpr int kWarps = 4;
constexpr int kInFlight = 8;

template <typename T, typename Out, int M, int R>
__global__ void __launch_bounds__(kWarps * 32)
    GemvFp8Kernel(const T* __restrict__ x, const Fp8* __restrict__ w, const float* __restrict__ w_scale,
                  const T* __restrict__ bias, Out* __restrict__ y, int64_t n, int64_t k) {
  constexpr int kSteps = kInFlight / R;
  constexpr int kStride = kWarps * 32;  // chunks between a thread's consecutive loads of one row
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t first_col = int64_t{blockIdx.x} * R;
  const uint4* wr[R];
#pragma unroll
  for (int j = 0; j < R; ++j) wr[j] = reinterpret_cast<const uint4*>(w + std::min(first_col + j, n - 1) * k);
  const int64_t chunks = k / 16;
  float acc[R][M];
#pragma unroll
  for (int j = 0; j < R; ++j) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[j][r] = 0.f;
  }
  int64_t c = threadIdx.x;
  uint4 wv[kSteps][R];
  if (c + (kSteps - 1) * kStride < chunks) {  // the first batch streams in while the kernel before may still run
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
#pragma unroll
      for (int j = 0; j < R; ++j) wv[u][j] = LoadOnce(wr[j] + c + u * kStride);
    }
  }
  WaitForPrerequisites();
  for (bool first = true; c + (kSteps - 1) * kStride < chunks; c += kSteps * kStride, first = false) {
    if (!first) {
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
#pragma unroll
        for (int j = 0; j < R; ++j) wv[u][j] = LoadOnce(wr[j] + c + u * kStride);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) AccumulateFp8<T, M, R>(wv[u], x, k, c + u * kStride, acc);
  }
  for (; c < chunks; c += kStride) {
    uint4 one[R];
#pragma unroll
    for (int j = 0; j < R; ++j) one[j] = LoadOnce(wr[j] + c);
    AccumulateFp8<T, M, R>(one, x, k, c, acc);
  }
  __shared__ float partial[kWarps][R][M];
#pragma unroll
  for (int j = 0; j < R; ++j) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      for (int off = 16; off > 0; off /= 2) acc[j][r] += __shfl_xor_sync(0xffffffff, acc[j][r], off);
      if (lane == 0) partial[warp][j][r] = acc[j][r];
    }
  }
  __syncthreads();
  if (threadIdx.x >= R * M) return;
  const int j = threadIdx.x / M, r = threadIdx.x % M;
  const int64_t col = first_col + j;
  if (col >= n) return;
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < kWarps; ++v) sum += partial[v][j][r];
  y[r * n + col] = To<Out>(fmaf(sum, w_scale[col], bias ? F(bias[col]) : 0.f));
}

// The tensor-core form (gemv_tiles.cuh): a block a tile of kTileRows e4m3 rows against all of X's rows as f16.
// An e4m3 row is half a bf16 row's bytes, so half bf16's warps split its k: 8 × 2 (64 registers, four blocks an SM)
// took the 8B model's fp8 decode chain in 2.86 ms at 1–8 rows on an H200, 16 × 2 in 2.91 (kernels/NOTES.md).
constexpr int kFp8TileWarps = 8, kFp8TileBatch = 2;

template <typename T, typename Out, int M>
__global__ void __launch_bounds__(kFp8TileWarps * 32, 1024 / (kFp8TileWarps * 32))
    GemvFp8TileKernel(const T* __restrict__ x, const Fp8* __restrict__ w, const float* __restrict__ w_scale,
                      const T* __restrict__ bias, Out* __restrict__ y, int64_t n, int64_t k) {
  __shared__ float part[kFp8TileWarps * 4 * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t first = int64_t{blockIdx.x} * kTileRows;
  const uint4* wa = reinterpret_cast<const uint4*>(w + std::min(first + g, n - 1) * k);
  const uint4* wb = reinterpret_cast<const uint4*>(w + std::min(first + g + 8, n - 1) * k);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  TileDot<T, M, Fp8, kFp8TileWarps, kFp8TileBatch>(wa, wb, x, k, warp, lane, false, acc);
  TileSum<kFp8TileWarps>(part, warp, lane, acc);
  if (warp != 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t col = first + g + 8 * h;
    if (col >= n) continue;
    const float s = w_scale[col], b = bias ? F(bias[col]) : 0.f;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      // The sum of X scaled by kFp8TileXScale, scaled back exactly (a power of two) before it is rounded.
      if (2 * t + e < M) y[(2 * t + e) * n + col] = To<Out>(fmaf(acc[2 * h + e] / kFp8TileXScale<T>, s, b));
    }
  }
}

template <int M>
constexpr int RowsPerBlock() {
  return M <= 2 ? 2 : 4;
}

template <typename T, typename Out, int M>
cudaError_t LaunchFp8Rows(const T* x, const Fp8* w, const float* w_scale, const T* bias, Out* y, int64_t n, int64_t k,
                          cudaStream_t stream) {
  constexpr int R = RowsPerBlock<M>();
  const int64_t blocks = (n + R - 1) / R;
  return LaunchDependent(GemvFp8Kernel<T, Out, M, R>, static_cast<unsigned>(blocks), kWarps * 32, stream, x, w, w_scale,
                         bias, y, n, k);
}

template <typename T, typename Out, int M>
cudaError_t LaunchFp8(const T* x, const Fp8* w, const float* w_scale, const T* bias, Out* y, int64_t n, int64_t k,
                      GemvForm form, cudaStream_t stream) {
  const bool tiles = form == GemvForm::kTensorCores || (form == GemvForm::kAuto && M >= kGemvFp8TensorCoreRows);
  if (!tiles) return LaunchFp8Rows<T, Out, M>(x, w, w_scale, bias, y, n, k, stream);
  const int64_t tiles_n = (n + kTileRows - 1) / kTileRows;
  return LaunchDependent(GemvFp8TileKernel<T, Out, M>, static_cast<unsigned>(tiles_n), kFp8TileWarps * 32, stream, x, w,
                         w_scale, bias, y, n, k);
}

template <typename T, typename Out, int... Ms>
cudaError_t DispatchFp8(int64_t m, const T* x, const Fp8* w, const float* w_scale, const T* bias, Out* y, int64_t n,
                        int64_t k, GemvForm form, cudaStream_t stream, std::integer_sequence<int, Ms...>) {
  cudaError_t result = cudaErrorInvalidValue;
  ((m == Ms + 1 ? (result = LaunchFp8<T, Out, Ms + 1>(x, w, w_scale, bias, y, n, k, form, stream), true) : false) ||
   ...);
  return result;
}

cudaError_t CheckRows(int64_t rows) {
  return rows > 0x7fffffff ? cudaErrorInvalidValue : cudaSuccess;
}

}  // namespace

template <typename T>
cudaError_t QuantizeRowsFp8(const T* src, int64_t rows, int64_t cols, Fp8* q, float* scales, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cols <= 0 || CheckRows(rows) != cudaSuccess) return cudaErrorInvalidValue;
  if (cols % 8 == 0 && cols <= int64_t{kQuantThreads} * kQuantVecs * 8 && Aligned(src) && Aligned(q)) {
    return LaunchDependent(QuantizeRowsVecKernel<T>, static_cast<unsigned>(rows), kQuantThreads, stream, src, cols, q,
                           scales);
  }
  return LaunchDependent(QuantizeRowsKernel<T>, static_cast<unsigned>(rows), kQuantThreads, stream, src, cols, q,
                         scales);
}

bool AddRmsNormFp8Supports(const void* residual, const void* delta, const void* weight, int64_t n) {
  return n > 0 && n % 8 == 0 && n <= int64_t{kNormThreads} * kNormVecs * 8 && Aligned(residual) && Aligned(delta) &&
         Aligned(weight);
}

template <typename T>
cudaError_t AddRmsNormFp8(T* residual, const T* delta, const T* weight, Fp8* q, float* scales, int64_t rows, int64_t n,
                          float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (!AddRmsNormFp8Supports(residual, delta, weight, n) || !Aligned(q) || CheckRows(rows) != cudaSuccess) {
    return cudaErrorInvalidValue;
  }
  return LaunchDependent(AddRmsNormFp8Kernel<T>, static_cast<unsigned>(rows), kNormThreads, stream, residual, delta,
                         weight, q, scales, n, eps);
}

template <typename T>
cudaError_t ActivateMulFp8(const T* gate_up, Fp8* q, float* scales, int64_t rows, int64_t inter, GatedActivation act,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (inter <= 0 || CheckRows(rows) != cudaSuccess) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>(rows);
  if (inter % 8 == 0 && inter <= int64_t{kSiluVecThreads} * kSiluVecs * 8 && Aligned(gate_up) && Aligned(q)) {
    switch (act) {
      case GatedActivation::kSilu:
        return LaunchDependent(ActivateMulFp8VecKernel<T, 0>, blocks, kSiluVecThreads, stream, gate_up, q, scales,
                               inter);
      case GatedActivation::kGeluTanh:
        return LaunchDependent(ActivateMulFp8VecKernel<T, 1>, blocks, kSiluVecThreads, stream, gate_up, q, scales,
                               inter);
    }
    return cudaErrorInvalidValue;
  }
  switch (act) {
    case GatedActivation::kSilu:
      return LaunchDependent(ActivateMulFp8Kernel<T, 0>, blocks, kSiluThreads, stream, gate_up, q, scales, inter);
    case GatedActivation::kGeluTanh:
      return LaunchDependent(ActivateMulFp8Kernel<T, 1>, blocks, kSiluThreads, stream, gate_up, q, scales, inter);
  }
  return cudaErrorInvalidValue;
}

bool GemvFp8Supports(const void* x, const void* w, int64_t m, int64_t k) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 16 == 0 && Aligned(x) && Aligned(w);
}

template <typename T, typename Out>
cudaError_t GemvFp8(const T* x, const Fp8* w, const float* w_scale, const T* bias, Out* y, int64_t m, int64_t n,
                    int64_t k, cudaStream_t stream, GemvForm form) {
  if (!GemvFp8Supports(x, w, m, k) || n <= 0 || n > 0x7fffffff) return cudaErrorInvalidValue;
  return DispatchFp8(m, x, w, w_scale, bias, y, n, k, form, stream, std::make_integer_sequence<int, kGemvMaxRows>{});
}

#define INFERD_INSTANTIATE(T)                                                                                         \
  template cudaError_t QuantizeRowsFp8<T>(const T*, int64_t, int64_t, Fp8*, float*, cudaStream_t);                    \
  template cudaError_t AddRmsNormFp8<T>(T*, const T*, const T*, Fp8*, float*, int64_t, int64_t, float, cudaStream_t); \
  template cudaError_t ActivateMulFp8<T>(const T*, Fp8*, float*, int64_t, int64_t, GatedActivation, cudaStream_t);    \
  template cudaError_t GemvFp8<T, T>(const T*, const Fp8*, const float*, const T*, T*, int64_t, int64_t, int64_t,     \
                                     cudaStream_t, GemvForm);                                                         \
  template cudaError_t GemvFp8<T, float>(const T*, const Fp8*, const float*, const T*, float*, int64_t, int64_t,      \
                                         int64_t, cudaStream_t, GemvForm);
INFERD_INSTANTIATE(__nv_bfloat16)
INFERD_INSTANTIATE(__half)
#undef INFERD_INSTANTIATE

}  // namespace inferd::kernels

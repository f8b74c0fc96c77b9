#include <algorithm>
#include <utility>

#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_rows.cuh"
#include "kernels/gemv_tiles.cuh"

namespace inferd::kernels {
namespace {

constexpr int kWarps = 4;  // warps per block

__device__ float Cast(float v, float*) {
  return v;
}
__device__ __nv_bfloat16 Cast(float v, __nv_bfloat16*) {
  return __float2bfloat16(v);
}
__device__ __half Cast(float v, __half*) {
  return __float2half(v);
}
__device__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ float ToFloat(__half v) {
  return __half2float(v);
}

// Where a warp's R output columns lie and what becomes of them. Plain products: R adjacent columns, written to Y
// (rows ldy apart) rounded once, the stores spread over the lanes.
struct PlainColumns {
  static constexpr int kCudaCoreRows = kGemvMaxRows;  // the rows the CUDA-core form serves
  int64_t ldy;
  __device__ bool NextStartsEarly() const { return false; }  // see RopeColumns

  template <int R>
  __device__ int64_t Col(int64_t warp, int j) const {
    return warp * R + j;
  }
  template <typename T, typename Out, int M, int R>
  __device__ void Store(const float (&acc)[R][M], int64_t warp, int lane, const T* bias, Out* y, int64_t n) const {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t col = Col<R>(warp, j);
      if (col >= n) break;
      const float b = bias ? ToFloat(bias[col]) : 0.f;
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (lane == (j * M + r) % 32) y[r * ldy + col] = Cast(acc[j][r] + b, static_cast<Out*>(nullptr));
      }
    }
  }

  // The tensor-core form (gemv_tiles.cuh): tile row i is W row tile · kTileRows + i.
  __device__ int64_t TileRow(int64_t tile, int i) const {
    return tile * kTileRows + i;
  }
  template <typename T, typename Out, int M>
  __device__ void StoreTile(const float (&acc)[4], int64_t tile, int lane, const T* bias, Out* y, int64_t n) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = TileRow(tile, g + 8 * h);
      if (col >= n) continue;
      const float b = bias ? ToFloat(bias[col]) : 0.f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (2 * t + e < M) y[(2 * t + e) * ldy + col] = Cast(acc[2 * h + e] + b, static_cast<Out*>(nullptr));
      }
    }
  }
};

// The fused q/k/v product of a decode step: a warp computes dimensions d and d + head_dim / 2 of one head (R = 2),
// rounds them as the plain product would, rotates q and k heads (RoPE, as RopeWriteKv does) and writes K and V
// into the token's cache slot.
template <typename T>
struct RopeColumns {
  static constexpr int kCudaCoreRows = kGemvTensorCoreRows - 1;  // only where kAuto picks CUDA cores
  const int32_t* positions;
  const int32_t* slots;
  const float* inv_freq;
  T* k_cache;
  T* v_cache;
  int32_t num_heads, num_kv_heads, head_dim;
  // Attention follows and reads the cache's earlier K/V before it waits: it may start while this product runs.
  bool attention_starts_early;

  __device__ bool NextStartsEarly() const { return attention_starts_early; }
  template <int R>
  __device__ int64_t Col(int64_t warp, int j) const {
    const int32_t half = head_dim / 2;
    return (warp / half) * head_dim + warp % half + j * half;
  }
  template <typename Unused, typename Out, int M, int R>
  __device__ void Store(const float (&acc)[R][M], int64_t warp, int lane, const T* bias, T* y, int64_t n) const {
    static_assert(R == 2, "a warp holds one rotation pair");
    const int32_t half = head_dim / 2;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (lane == r) Emit(r, warp / half, warp % half, acc[0][r], acc[1][r], bias, y, n);
    }
  }

  // The tensor-core form: a tile holds dimensions d0..d0 + 7 of one head and their partners d0 + head_dim / 2 …
  // (head_dim / 2 a multiple of 8).
  __device__ int64_t TileRow(int64_t tile, int i) const {
    const int32_t half = head_dim / 2, tiles = half / 8;
    return (tile / tiles) * head_dim + (tile % tiles) * 8 + (i < 8 ? i : half + i - 8);
  }
  template <typename Unused, typename Out, int M>
  __device__ void StoreTile(const float (&acc)[4], int64_t tile, int lane, const T* bias, T* y, int64_t n) const {
    const int g = lane / 4, t = lane % 4, tiles = head_dim / 16;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (2 * t + e < M) Emit(2 * t + e, tile / tiles, (tile % tiles) * 8 + g, acc[e], acc[2 + e], bias, y, n);
    }
  }

  // Row r's dimensions d and d + head_dim / 2 of `head` from their sums: rounded as the plain product rounds, q and
  // k heads rotated, K and V written to the row's cache slot.
  __device__ void Emit(int r, int64_t head, int64_t d, float a_sum, float b_sum, const T* bias, T* y, int64_t n) const {
    const int32_t half = head_dim / 2;
    const int64_t col = head * head_dim + d;
    if (col >= n) return;
    const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
    const T a = Cast(a_sum + (bias ? ToFloat(bias[col]) : 0.f), static_cast<T*>(nullptr));
    const T b = Cast(b_sum + (bias ? ToFloat(bias[col + half]) : 0.f), static_cast<T*>(nullptr));
    if (head >= num_heads + num_kv_heads) {  // a v head: into the cache unrotated
      const int64_t at = int64_t{slots[r]} * kv_dim + (head - num_heads - num_kv_heads) * head_dim + d;
      y[r * n + col] = a;
      y[r * n + col + half] = b;
      v_cache[at] = a;
      v_cache[at + half] = b;
      return;
    }
    const float angle = static_cast<float>(positions[r]) * inv_freq[d];
    const float c = ToFloat(Cast(cosf(angle), static_cast<T*>(nullptr)));
    const float s = ToFloat(Cast(sinf(angle), static_cast<T*>(nullptr)));
    const float fa = ToFloat(a), fb = ToFloat(b);
    const T ra = Cast(fa * c - fb * s, static_cast<T*>(nullptr)), rb = Cast(fb * c + fa * s, static_cast<T*>(nullptr));
    y[r * n + col] = ra;
    y[r * n + col + half] = rb;
    if (head >= num_heads) {  // a k head
      const int64_t at = int64_t{slots[r]} * kv_dim + (head - num_heads) * head_dim + d;
      k_cache[at] = ra;
      k_cache[at + half] = rb;
    }
  }
};

// The gate/up product with the gated activation after it: a warp computes column i of the gate and of the up
// halves (R = 2), rounds each as the plain product would and writes act(gate) · up as ActivateMul does.
template <int kActivation>
struct GatedColumns {
  static constexpr int kCudaCoreRows = kGemvTensorCoreRows - 1;  // only where kAuto picks CUDA cores
  int64_t inter;
  __device__ bool NextStartsEarly() const { return false; }

  template <int R>
  __device__ int64_t Col(int64_t warp, int j) const {
    return warp + j * inter;
  }
  template <typename T, typename Out, int M, int R>
  __device__ void Store(const float (&acc)[R][M], int64_t warp, int lane, const T*, T* out, int64_t) const {
    static_assert(R == 2, "a warp holds one gate and one up column");
    if (warp >= inter) return;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (lane == r) out[r * inter + warp] = GatedValue<T, kActivation>(acc[0][r], acc[1][r]);
    }
  }

  // The tensor-core form: a tile holds gate columns i..i + 7 and their up columns.
  __device__ int64_t TileRow(int64_t tile, int i) const {
    return tile * 8 + (i < 8 ? i : inter + i - 8);
  }
  template <typename T, typename Out, int M>
  __device__ void StoreTile(const float (&acc)[4], int64_t tile, int lane, const T*, T* out, int64_t) const {
    const int g = lane / 4, t = lane % 4;
    const int64_t col = tile * 8 + g;
    if (col >= inter) return;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (2 * t + e < M) out[(2 * t + e) * inter + col] = GatedValue<T, kActivation>(acc[e], acc[2 + e]);
    }
  }
};

// Each warp computes R output columns for all M rows: its lanes sweep k in 16-byte chunks, each X chunk loaded
// once for the R rows of W (so L1 serves M / R bytes of X per byte of W), kGemvInFlight loads of W in flight.
template <typename T, typename Out, int M, int R, typename Columns>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, Out* __restrict__ y,
               int64_t n, int64_t k, Columns columns) {
  constexpr int kSteps = kGemvInFlight / R;  // chunk steps per batch of loads
  const int lane = threadIdx.x % 32;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (columns.template Col<R>(warp, 0) >= n) return;
  const uint4* wr[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    wr[j] = reinterpret_cast<const uint4*>(w + std::min(columns.template Col<R>(warp, j), n - 1) * k);
  }
  const int64_t chunks = k / 8;
  float acc[R][M];
#pragma unroll
  for (int j = 0; j < R; ++j) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[j][r] = 0.f;
  }
  int64_t c = lane;
  // The first batch of weights streams in while the kernel that writes X may still run (dependent launch).
  uint4 wv[kSteps][R];
  const bool full_batch = c + (kSteps - 1) * 32 < chunks;
  if (full_batch) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
#pragma unroll
      for (int j = 0; j < R; ++j) wv[u][j] = LoadOnce(wr[j] + c + u * 32);
    }
  }
  WaitForPrerequisites();
  if (columns.NextStartsEarly()) AllowDependentsToLaunch();
  for (bool first = true; c + (kSteps - 1) * 32 < chunks; c += kSteps * 32, first = false) {
    if (!first) {
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
#pragma unroll
        for (int j = 0; j < R; ++j) wv[u][j] = LoadOnce(wr[j] + c + u * 32);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) Accumulate<T, M, R>(wv[u], x, k, c + u * 32, acc);
  }
  for (; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int j = 0; j < R; ++j) wv[j] = LoadOnce(wr[j] + c);
    Accumulate<T, M, R>(wv, x, k, c, acc);
  }
  WarpSum<M, R>(acc);
  columns.template Store<T, Out, M, R>(acc, warp, lane, bias, y, n);
}

// The tensor-core form: one tile of kTileRows W rows a block, its warps splitting k (gemv_tiles.cuh).
template <typename T, typename Out, int M, typename Columns>
__global__ void __launch_bounds__(kTileWarps * 32)
    GemvTileKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, Out* __restrict__ y,
                   int64_t n, int64_t k, Columns columns) {
  __shared__ float part[kTileWarps * 4 * 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  const int64_t tile = blockIdx.x;
  const uint4* wa = reinterpret_cast<const uint4*>(w + std::min(columns.TileRow(tile, g), n - 1) * k);
  const uint4* wb = reinterpret_cast<const uint4*>(w + std::min(columns.TileRow(tile, g + 8), n - 1) * k);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  TileDot<T, M>(wa, wb, x, k, warp, lane, columns.NextStartsEarly(), acc);
  TileSum(part, warp, lane, acc);
  if (warp == 0) columns.template StoreTile<T, Out, M>(acc, tile, lane, bias, y, n);
}

template <typename T, typename Out, int M, typename Columns>
cudaError_t LaunchTiles(const T* x, const T* w, const T* bias, Out* y, int64_t n, int64_t k, int64_t tiles,
                        cudaStream_t stream, Columns columns) {
  return LaunchDependent(GemvTileKernel<T, Out, M, Columns>, static_cast<unsigned>(tiles), kTileWarps * 32, stream, x,
                         w, bias, y, n, k, columns);
}

// W rows per warp: two for one or two X rows, four as X grows, so each X chunk serves more W rows. For one X row,
// one W row per warp measured no better (8B chain, products timed one by one: 6.01 ms with 4 loads in flight,
// 6.39 with 8; two rows 5.95 — differences near the run-to-run noise).
template <int M>
constexpr int RowsPerWarp() {
  return M <= 2 ? 2 : 4;
}

template <typename T, typename Out, int M, typename Columns>
cudaError_t LaunchRows(const T* x, const T* w, const T* bias, Out* y, int64_t n, int64_t k, cudaStream_t stream,
                       Columns columns) {
  constexpr int R = RowsPerWarp<M>();
  const int64_t blocks = (n + kWarps * R - 1) / (kWarps * R);
  return LaunchDependent(GemvKernel<T, Out, M, R, Columns>, static_cast<unsigned>(blocks), kWarps * 32, stream, x, w,
                         bias, y, n, k, columns);
}

bool UseTensorCores(int64_t m, GemvForm form) {
  return form == GemvForm::kTensorCores || (form == GemvForm::kAuto && m >= kGemvTensorCoreRows);
}

template <typename T, typename Out, int M, typename Columns>
cudaError_t LaunchForm(bool tensor_cores, const T* x, const T* w, const T* bias, Out* y, int64_t n, int64_t k,
                       int64_t tiles, cudaStream_t stream, Columns columns) {
  if constexpr (M <= Columns::kCudaCoreRows) {
    if (!tensor_cores) return LaunchRows<T, Out, M>(x, w, bias, y, n, k, stream, columns);
  }
  return LaunchTiles<T, Out, M>(x, w, bias, y, n, k, tiles, stream, columns);
}

// A product of m rows (1..kGemvMaxRows) in the form `form` picks, over `tiles` tiles where it runs on tensor cores.
template <typename T, typename Out, typename Columns, int... Ms>
cudaError_t Dispatch(int64_t m, GemvForm form, const T* x, const T* w, const T* bias, Out* y, int64_t n, int64_t k,
                     int64_t tiles, cudaStream_t stream, Columns columns, std::integer_sequence<int, Ms...>) {
  cudaError_t result = cudaErrorInvalidValue;
  const bool tensor_cores = UseTensorCores(m, form);
  ((m == Ms + 1 ? (result = LaunchForm<T, Out, Ms + 1>(tensor_cores, x, w, bias, y, n, k, tiles, stream, columns), true)
                : false) ||
   ...);
  return result;
}

}  // namespace

bool GemvSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && aligned(x) && aligned(w);
}

template <typename T, typename Out>
cudaError_t Gemv(const T* x, const T* w, const T* bias, Out* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                 int64_t ldy, GemvForm form) {
  if (ldy == 0) ldy = n;
  if (!GemvSupports(x, w, m, k) || n <= 0 || ldy < n || (n + kWarps - 1) / kWarps > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  return Dispatch(m, form, x, w, bias, y, n, k, (n + kTileRows - 1) / kTileRows, stream, PlainColumns{ldy},
                  std::make_integer_sequence<int, kGemvMaxRows>{});
}

bool GemvQkvRopeSupports(const void* x, const void* w, int64_t m, int64_t k, int32_t head_dim) {
  return GemvSupports(x, w, m, k) && head_dim % 2 == 0 && (m < kGemvTensorCoreRows || head_dim % 16 == 0);
}

template <typename T>
cudaError_t GemvQkvRope(const T* x, const T* w, const T* bias, T* qkv, int64_t m, int64_t k, const int32_t* positions,
                        const int32_t* slots, const float* inv_freq, T* k_cache, T* v_cache, int32_t num_heads,
                        int32_t num_kv_heads, int32_t head_dim, cudaStream_t stream, bool attention_starts_early) {
  const int64_t heads = num_heads + 2 * num_kv_heads, n = heads * head_dim;
  if (!GemvQkvRopeSupports(x, w, m, k, head_dim) || num_kv_heads <= 0) return cudaErrorInvalidValue;
  const RopeColumns<T> columns{
      positions, slots, inv_freq, k_cache, v_cache, num_heads, num_kv_heads, head_dim, attention_starts_early};
  return Dispatch(m, GemvForm::kAuto, x, w, bias, qkv, n, k, heads * (head_dim / 16), stream, columns,
                  std::make_integer_sequence<int, kGemvMaxRows>{});
}

template <typename T>
cudaError_t GemvGatedAct(const T* x, const T* w, T* out, int64_t m, int64_t inter, int64_t k, GatedActivation act,
                         cudaStream_t stream) {
  if (inter <= 0 || !GemvSupports(x, w, m, k) || (2 * inter + 7) / 8 > 0x7fffffff) return cudaErrorInvalidValue;
  const auto launch = [&](auto columns) {
    return Dispatch(m, GemvForm::kAuto, x, w, static_cast<const T*>(nullptr), out, 2 * inter, k, (inter + 7) / 8,
                    stream, columns, std::make_integer_sequence<int, kGemvMaxRows>{});
  };
  constexpr int kSilu = static_cast<int>(GatedActivation::kSilu), kGelu = static_cast<int>(GatedActivation::kGeluTanh);
  return act == GatedActivation::kGeluTanh ? launch(GatedColumns<kGelu>{inter}) : launch(GatedColumns<kSilu>{inter});
}

template cudaError_t GemvQkvRope(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                 int64_t, int64_t, const int32_t*, const int32_t*, const float*, __nv_bfloat16*,
                                 __nv_bfloat16*, int32_t, int32_t, int32_t, cudaStream_t, bool);
template cudaError_t GemvQkvRope(const __half*, const __half*, const __half*, __half*, int64_t, int64_t, const int32_t*,
                                 const int32_t*, const float*, __half*, __half*, int32_t, int32_t, int32_t,
                                 cudaStream_t, bool);
template cudaError_t GemvGatedAct(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t, int64_t,
                                  GatedActivation, cudaStream_t);
template cudaError_t GemvGatedAct(const __half*, const __half*, __half*, int64_t, int64_t, int64_t, GatedActivation,
                                  cudaStream_t);
template cudaError_t Gemv(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                          int64_t, int64_t, cudaStream_t, int64_t, GemvForm);
template cudaError_t Gemv(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, float*, int64_t, int64_t,
                          int64_t, cudaStream_t, int64_t, GemvForm);
template cudaError_t Gemv(const __half*, const __half*, const __half*, __half*, int64_t, int64_t, int64_t, cudaStream_t,
                          int64_t, GemvForm);
template cudaError_t Gemv(const __half*, const __half*, const __half*, float*, int64_t, int64_t, int64_t, cudaStream_t,
                          int64_t, GemvForm);

}  // namespace inferd::kernels

#include <cstdint>

#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/fp8_convert.cuh"
#include "kernels/moe_fp8.h"
#include "kernels/moe_routing.h"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 256;
// The per-slot passes: a warp a slot, blocks of 2 (at 64 rows' 512 slots, 256 blocks over the SMs; at prefill's
// tens of thousands, 32 blocks, 64 rows, resident on each).
constexpr int kRowsPerBlock = 2;

// A warp a slot, two passes over its source row, 8 values a lane at a time (n a multiple of 8): the largest
// magnitude, then the quantized values (QuantizeRowOf's arithmetic).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    GatherFp8Kernel(const T* __restrict__ x, const int32_t* __restrict__ sorted, int64_t slots, int32_t k, int64_t n,
                    Fp8* __restrict__ q, float* __restrict__ scales) {
  WaitForPrerequisites();
  const int64_t i = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32;
  if (i >= slots) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t{sorted[i] / k} * n);
  const int64_t vectors = n / 8;
  float amax = 0.f;
  for (int64_t v = lane; v < vectors; v += 32) {
    const uint4 u = src[v];
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(F(e[j])));
  }
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, offset));
  const float s = ScaleFor(amax);
  uint2* out = reinterpret_cast<uint2*>(q + i * n);
  for (int64_t v = lane; v < vectors; v += 32) {
    const uint4 u = src[v];
    const T* e = reinterpret_cast<const T*>(&u);
    uint2 packed;
    Fp8* p = reinterpret_cast<Fp8*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = Quantize(F(e[j]), s);
    out[v] = packed;
  }
  if (lane == 0) scales[i] = s;
}

// A product's output element from its sum: scaled by the input row's and the weight row's scales, rounded to T.
template <typename T>
__device__ __forceinline__ float ScaledSum(__nv_bfloat16 sum, float row_scale, float weight_scale) {
  return Round<T>(F(sum) * row_scale * weight_scale);
}

// A gated value from its gate and up sums and their weights' scales.
template <typename T, int A>
__device__ __forceinline__ float Gated(__nv_bfloat16 gate_sum, __nv_bfloat16 up_sum, float row_scale, float gate_scale,
                                       float up_scale) {
  const float gate = ScaledSum<T>(gate_sum, row_scale, gate_scale), up = ScaledSum<T>(up_sum, row_scale, up_scale);
  return Round<T>(Round<T>(Activate<A>(gate)) * up);
}

template <typename T, int A>
__device__ __forceinline__ float GatedAt(const __nv_bfloat16* __restrict__ g, float row_scale,
                                         const float* __restrict__ ws, int64_t inter, int64_t j) {
  return Gated<T, A>(g[j], g[inter + j], row_scale, ws[j], ws[inter + j]);
}

// Rows of up to this many values (a multiple of 8; Qwen3-30B-A3B's experts' 768 among them) are read once by a warp
// a slot, each lane's values kept in registers between the largest magnitude and the rounding.
constexpr int64_t kVecSlotMax = 1024;

// Two passes over a slot's sums (the row is in L1 or L2 for the second): the gated values and their largest
// magnitude, then the quantized values. kWarp: a warp a slot, kRowsPerBlock a block (prefill's many slots: more of
// them in flight on an SM); else a block of kThreads a slot (a decode step's few: each slot's exps spread over more
// threads).
template <typename T, int A, bool kWarp>
__global__ void __launch_bounds__(kWarp ? 32 * kRowsPerBlock : kThreads)
    ActivateMulFp8Kernel(const __nv_bfloat16* __restrict__ gate_up, const float* __restrict__ x_scales,
                         const float* __restrict__ w_scale, const int32_t* __restrict__ ids,
                         const int32_t* __restrict__ sorted, int64_t slots, int64_t inter, bool vec,
                         Fp8* __restrict__ q, float* __restrict__ scales) {
  WaitForPrerequisites();
  const int64_t i = kWarp ? int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32 : int64_t{blockIdx.x};
  if (kWarp && i >= slots) return;
  const __nv_bfloat16* g = gate_up + i * 2 * inter;
  const float* ws = w_scale + int64_t{ids[sorted[i]]} * 2 * inter;
  const float row_scale = x_scales[i];
  const auto value = [&](int64_t j) { return GatedAt<T, A>(g, row_scale, ws, inter, j); };
  if constexpr (kWarp) {
    if (vec) {  // MoeActivateMulFp8 checked the row length and the alignment this needs
      const auto load = [&](int64_t v, float(&out)[8]) {
        const int64_t j = v * 8;
        const uint4 gv = *reinterpret_cast<const uint4*>(g + j), uv = *reinterpret_cast<const uint4*>(g + inter + j);
        const __nv_bfloat16* ge = reinterpret_cast<const __nv_bfloat16*>(&gv);
        const __nv_bfloat16* ue = reinterpret_cast<const __nv_bfloat16*>(&uv);
        float gs[8], us[8];
        *reinterpret_cast<float4*>(gs) = *reinterpret_cast<const float4*>(ws + j);
        *reinterpret_cast<float4*>(gs + 4) = *reinterpret_cast<const float4*>(ws + j + 4);
        *reinterpret_cast<float4*>(us) = *reinterpret_cast<const float4*>(ws + inter + j);
        *reinterpret_cast<float4*>(us + 4) = *reinterpret_cast<const float4*>(ws + inter + j + 4);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = Gated<T, A>(ge[e], ue[e], row_scale, gs[e], us[e]);
      };
      WarpQuantizeVecRowOf<kVecSlotMax / (8 * 32)>(load, inter, q + i * inter, scales + i);
    } else {
      WarpQuantizeRowOf(value, inter, q + i * inter, scales + i);
    }
  } else {
    QuantizeRowOf<kThreads>(value, inter, q + i * inter, scales + i);
  }
}

// Block (row, column tile), a column a thread: its k slots' scaled outputs, weighted, summed in k order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    CombineFp8Kernel(const __nv_bfloat16* __restrict__ y, const float* __restrict__ act_scales,
                     const float* __restrict__ w_scale, const int32_t* __restrict__ ids,
                     const int32_t* __restrict__ positions, const float* __restrict__ weights, int32_t k, int64_t n,
                     T* __restrict__ out) {
  WaitForPrerequisites();
  const int64_t r = blockIdx.x, c = int64_t{blockIdx.y} * kThreads + threadIdx.x;
  if (c >= n) return;
  float acc = 0.f;
  for (int32_t j = 0; j < k; ++j) {
    const int64_t s = r * k + j, p = positions[s];
    acc = fmaf(weights[s], ScaledSum<T>(y[p * n + c], act_scales[p], w_scale[int64_t{ids[s]} * n + c]), acc);
  }
  out[r * n + c] = To<T>(acc);
}

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

template <typename T>
cudaError_t MoeGatherFp8(const T* x, const int32_t* sorted_slots, int64_t slots, int32_t k, int64_t n, Fp8* q,
                         float* scales, cudaStream_t stream) {
  if (slots < 1 || slots > INT32_MAX || k < 1 || n < 1 || n % 8 != 0 || !Aligned(x) ||
      reinterpret_cast<uintptr_t>(q) % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((slots + kRowsPerBlock - 1) / kRowsPerBlock);
  return LaunchDependent(GatherFp8Kernel<T>, blocks, 32 * kRowsPerBlock, stream, x, sorted_slots, slots, k, n, q,
                         scales);
}

template <typename T>
cudaError_t MoeActivateMulFp8(const __nv_bfloat16* gate_up, const float* x_scales, const float* w_scale,
                              const int32_t* topk_ids, const int32_t* sorted_slots, int64_t slots, int64_t inter,
                              GatedActivation act, Fp8* q, float* scales, cudaStream_t stream) {
  if (slots < 1 || slots > INT32_MAX || inter < 1) return cudaErrorInvalidValue;
  // A warp a slot from this many (measured on an H100 at Qwen3-30B-A3B's 768: a decode step's 512 slots took 19 µs a
  // warp each against 7.4 a block each; prefill's 32,768 135 µs against 182).
  constexpr int64_t kWarpSlotsFrom = 4096;
  const bool vec = inter % 8 == 0 && inter <= kVecSlotMax && Aligned(gate_up) && Aligned(w_scale) &&
                   reinterpret_cast<uintptr_t>(q) % 8 == 0;
  const auto launch = [&](auto kernel, bool warp) {
    const int64_t rows_per_block = warp ? kRowsPerBlock : 1;
    return LaunchDependent(kernel, static_cast<unsigned>((slots + rows_per_block - 1) / rows_per_block),
                           warp ? 32 * kRowsPerBlock : kThreads, stream, gate_up, x_scales, w_scale, topk_ids,
                           sorted_slots, slots, inter, vec, q, scales);
  };
  constexpr int kSilu = static_cast<int>(GatedActivation::kSilu), kGelu = static_cast<int>(GatedActivation::kGeluTanh);
  const bool warp = slots >= kWarpSlotsFrom;
  if (act == GatedActivation::kGeluTanh) {
    return warp ? launch(ActivateMulFp8Kernel<T, kGelu, true>, true)
                : launch(ActivateMulFp8Kernel<T, kGelu, false>, false);
  }
  return warp ? launch(ActivateMulFp8Kernel<T, kSilu, true>, true)
              : launch(ActivateMulFp8Kernel<T, kSilu, false>, false);
}

template <typename T>
cudaError_t MoeCombineFp8(const __nv_bfloat16* y, const float* act_scales, const float* w_scale,
                          const int32_t* topk_ids, const int32_t* slot_positions, const float* topk_weights,
                          int64_t rows, int32_t k, int64_t n, T* out, cudaStream_t stream) {
  const int64_t tiles = (n + kThreads - 1) / kThreads;
  if (rows < 1 || rows > INT32_MAX || k < 1 || k > kMoeMaxTopK || n < 1 || tiles > 65535) return cudaErrorInvalidValue;
  return LaunchDependent(CombineFp8Kernel<T>, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(tiles)), kThreads,
                         stream, y, act_scales, w_scale, topk_ids, slot_positions, topk_weights, k, n, out);
}

#define INFERD_MOE_FP8(T)                                                                                              \
  template cudaError_t MoeGatherFp8(const T*, const int32_t*, int64_t, int32_t, int64_t, Fp8*, float*, cudaStream_t);  \
  template cudaError_t MoeActivateMulFp8<T>(const __nv_bfloat16*, const float*, const float*, const int32_t*,          \
                                            const int32_t*, int64_t, int64_t, GatedActivation, Fp8*, float*,           \
                                            cudaStream_t);                                                             \
  template cudaError_t MoeCombineFp8(const __nv_bfloat16*, const float*, const float*, const int32_t*, const int32_t*, \
                                     const float*, int64_t, int32_t, int64_t, T*, cudaStream_t);
INFERD_MOE_FP8(__nv_bfloat16)
INFERD_MOE_FP8(__half)
#undef INFERD_MOE_FP8

}  // namespace inferd::kernels

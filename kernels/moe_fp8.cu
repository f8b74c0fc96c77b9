#include <cstdint>

#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/fp8_convert.cuh"
#include "kernels/moe_fp8.h"
#include "kernels/moe_routing.h"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 256;

// One block a slot, two passes over its source row: the largest magnitude, then the quantized values.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GatherFp8Kernel(const T* __restrict__ x, const int32_t* __restrict__ sorted, int32_t k, int64_t n,
                    Fp8* __restrict__ q, float* __restrict__ scales) {
  WaitForPrerequisites();
  const int64_t i = blockIdx.x;
  const T* src = x + int64_t{sorted[i] / k} * n;
  QuantizeRowOf<kThreads>([&](int64_t c) { return F(src[c]); }, n, q + i * n, scales + i);
}

// A product's output element from its sum: scaled by the input row's and the weight row's scales, rounded to T.
template <typename T>
__device__ __forceinline__ float ScaledSum(__nv_bfloat16 sum, float row_scale, float weight_scale) {
  return Round<T>(F(sum) * row_scale * weight_scale);
}

template <typename T, int A>
__device__ __forceinline__ float GatedAt(const __nv_bfloat16* __restrict__ g, float row_scale,
                                         const float* __restrict__ ws, int64_t inter, int64_t j) {
  const float gate = ScaledSum<T>(g[j], row_scale, ws[j]);
  const float up = ScaledSum<T>(g[inter + j], row_scale, ws[inter + j]);
  return Round<T>(Round<T>(Activate<A>(gate)) * up);
}

// One block a slot, two passes (the row is in L2 for the second): the gated values and their largest magnitude,
// then the quantized values.
template <typename T, int A>
__global__ void __launch_bounds__(kThreads)
    ActivateMulFp8Kernel(const __nv_bfloat16* __restrict__ gate_up, const float* __restrict__ x_scales,
                         const float* __restrict__ w_scale, const int32_t* __restrict__ ids,
                         const int32_t* __restrict__ sorted, int64_t inter, Fp8* __restrict__ q,
                         float* __restrict__ scales) {
  WaitForPrerequisites();
  const int64_t i = blockIdx.x;
  const __nv_bfloat16* g = gate_up + i * 2 * inter;
  const float* ws = w_scale + int64_t{ids[sorted[i]]} * 2 * inter;
  const float row_scale = x_scales[i];
  QuantizeRowOf<kThreads>([&](int64_t j) { return GatedAt<T, A>(g, row_scale, ws, inter, j); }, inter, q + i * inter,
                          scales + i);
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
  if (slots < 1 || slots > INT32_MAX || k < 1 || n < 1 || !Aligned(x)) return cudaErrorInvalidValue;
  return LaunchDependent(GatherFp8Kernel<T>, static_cast<unsigned>(slots), kThreads, stream, x, sorted_slots, k, n, q,
                         scales);
}

template <typename T>
cudaError_t MoeActivateMulFp8(const __nv_bfloat16* gate_up, const float* x_scales, const float* w_scale,
                              const int32_t* topk_ids, const int32_t* sorted_slots, int64_t slots, int64_t inter,
                              GatedActivation act, Fp8* q, float* scales, cudaStream_t stream) {
  if (slots < 1 || slots > INT32_MAX || inter < 1) return cudaErrorInvalidValue;
  constexpr int kSilu = static_cast<int>(GatedActivation::kSilu), kGelu = static_cast<int>(GatedActivation::kGeluTanh);
  const unsigned blocks = static_cast<unsigned>(slots);
  return act == GatedActivation::kGeluTanh
             ? LaunchDependent(ActivateMulFp8Kernel<T, kGelu>, blocks, kThreads, stream, gate_up, x_scales, w_scale,
                               topk_ids, sorted_slots, inter, q, scales)
             : LaunchDependent(ActivateMulFp8Kernel<T, kSilu>, blocks, kThreads, stream, gate_up, x_scales, w_scale,
                               topk_ids, sorted_slots, inter, q, scales);
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

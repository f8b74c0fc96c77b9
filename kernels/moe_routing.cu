#include <cfloat>
#include <cstdint>

#include "kernels/dependent_launch.cuh"
#include "kernels/moe_routing.h"

namespace inferd::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // one warp a row
constexpr int kPerLane = kMoeMaxExperts / kWarp;

// The larger of two (weight, expert) pairs: the larger weight, the lower expert among equals.
__device__ __forceinline__ bool Before(float w, int e, float w2, int e2) {
  return w > w2 || (w == w2 && e < e2);
}

// One warp per row: the softmax, then k rounds of a warp-wide arg-max over what is left; every lane counts its
// row's experts into `counts` (where given).
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    TopKKernel(const float* __restrict__ logits, int64_t rows, int32_t experts, int32_t k, bool normalize,
               int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights, int32_t* __restrict__ counts) {
  WaitForPrerequisites();
  const int lane = threadIdx.x % kWarp;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float* x = logits + row * experts;
  float p[kPerLane];
  float top = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < experts ? x[e] : -FLT_MAX;
    top = fmaxf(top, p[i]);
  }
  for (int o = kWarp / 2; o > 0; o /= 2) top = fmaxf(top, __shfl_xor_sync(~0u, top, o));
  float total = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < experts ? expf(p[i] - top) : 0.f;
    total += p[i];
  }
  for (int o = kWarp / 2; o > 0; o /= 2) total += __shfl_xor_sync(~0u, total, o);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] /= total;
  float chosen_w[kMoeMaxTopK];
  int chosen_e[kMoeMaxTopK];
  float sum = 0;
  for (int j = 0; j < k; ++j) {
    float w = -1.f;  // below every probability: taken experts are marked with it
    int e = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int ei = lane + i * kWarp;
      if (ei < experts && Before(p[i], ei, w, e)) w = p[i], e = ei;
    }
    for (int o = kWarp / 2; o > 0; o /= 2) {
      const float w2 = __shfl_xor_sync(~0u, w, o);
      const int e2 = __shfl_xor_sync(~0u, e, o);
      if (Before(w2, e2, w, e)) w = w2, e = e2;
    }
    chosen_w[j] = w;
    chosen_e[j] = e;
    sum += w;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + i * kWarp == e) p[i] = -1.f;
    }
  }
  if (lane < k) {
    float w = 0;
    int e = 0;
    for (int j = 0; j < k; ++j) {  // lane j writes slot j (registers are not indexed by a lane's number)
      if (j == lane) w = chosen_w[j], e = chosen_e[j];
    }
    topk_ids[row * k + lane] = e;
    topk_weights[row * k + lane] = normalize ? w / sum : w;
    if (counts) atomicAdd(counts + e, 1);
  }
}

// One block: the experts' runs (an exclusive prefix sum of the counts, a thread an expert, in log2(experts) steps),
// then every slot into its expert's run.
constexpr int kGroupThreads = 1024;
static_assert(kMoeMaxExperts <= kGroupThreads, "a thread an expert");

__global__ void __launch_bounds__(kGroupThreads)
    GroupKernel(const int32_t* __restrict__ topk_ids, int64_t slots, int32_t experts, int32_t* __restrict__ counts,
                int32_t* __restrict__ offsets, int32_t* __restrict__ sorted, int32_t* __restrict__ positions,
                int32_t* __restrict__ touched) {
  WaitForPrerequisites();
  __shared__ int32_t cursor[kMoeMaxExperts];
  const int e = threadIdx.x;
  const int32_t count = e < experts ? counts[e] : 0;
  if (e < experts) cursor[e] = count;
  const int experts_with_rows = __syncthreads_count(count > 0);
  if (touched && threadIdx.x == 0) *touched += experts_with_rows;
  for (int step = 1; step < experts; step *= 2) {  // cursor[e]: the sum of counts[0..e]
    const int32_t before = e < experts && e >= step ? cursor[e - step] : 0;
    __syncthreads();
    if (e < experts) cursor[e] += before;
    __syncthreads();
  }
  if (e < experts) {
    const int32_t through = cursor[e];
    offsets[e] = through - count;
    if (e == experts - 1) offsets[experts] = through;
  }
  __syncthreads();
  if (e < experts) cursor[e] = offsets[e];
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t at = atomicAdd(&cursor[topk_ids[s]], 1);
    sorted[at] = static_cast<int32_t>(s);
    if (positions) positions[s] = at;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;  // ready for the next call
}

}  // namespace

cudaError_t MoeRoute(const float* logits, int64_t rows, int32_t experts, int32_t k, bool normalize, int32_t* topk_ids,
                     float* topk_weights, int32_t* counts, int32_t* expert_offsets, int32_t* sorted_slots,
                     int32_t* slot_positions, cudaStream_t stream, int32_t* experts_touched) {
  if (rows < 1 || k < 1 || k > experts || experts > kMoeMaxExperts || k > kMoeMaxTopK || rows * k > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  cudaError_t err = LaunchDependent(TopKKernel, blocks, kWarp * kRowsPerBlock, stream, logits, rows, experts, k,
                                    normalize, topk_ids, topk_weights, counts);
  if (err != cudaSuccess) return err;
  return LaunchDependent(GroupKernel, 1, kGroupThreads, stream, topk_ids, rows * k, experts, counts, expert_offsets,
                         sorted_slots, slot_positions, experts_touched);
}

cudaError_t MoeTopK(const float* logits, int64_t rows, int32_t experts, int32_t k, bool normalize, int32_t* topk_ids,
                    float* topk_weights, cudaStream_t stream) {
  if (rows < 1 || k < 1 || k > experts || experts > kMoeMaxExperts || k > kMoeMaxTopK || rows * k > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  return LaunchDependent(TopKKernel, blocks, kWarp * kRowsPerBlock, stream, logits, rows, experts, k, normalize,
                         topk_ids, topk_weights, static_cast<int32_t*>(nullptr));
}

namespace {

constexpr int kVecThreads = 256;

// One block a slot (a row of the grouped order): its source row, 8 elements a thread at a time.
template <typename T>
__global__ void __launch_bounds__(kVecThreads) GatherKernel(const T* __restrict__ x, const int32_t* __restrict__ sorted,
                                                            int32_t k, int64_t n, T* __restrict__ out) {
  WaitForPrerequisites();
  const int64_t i = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t{sorted[i] / k} * n);
  uint4* dst = reinterpret_cast<uint4*>(out + i * n);
  for (int64_t c = threadIdx.x; c < n / 8; c += kVecThreads) dst[c] = src[c];
}

__device__ __forceinline__ float AsFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float AsFloat(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ void Store(float v, __nv_bfloat16* p) {
  *p = __float2bfloat16(v);
}
__device__ __forceinline__ void Store(float v, __half* p) {
  *p = __float2half(v);
}

// Block (row, column tile): its k slots' outputs, weighted, summed in k order, a column a thread.
template <typename T>
__global__ void __launch_bounds__(kVecThreads)
    CombineKernel(const T* __restrict__ y, const int32_t* __restrict__ positions, const float* __restrict__ weights,
                  int32_t k, int64_t n, T* __restrict__ out) {
  WaitForPrerequisites();
  const int64_t r = blockIdx.x, c = int64_t{blockIdx.y} * kVecThreads + threadIdx.x;
  if (c >= n) return;
  float acc = 0;
  for (int32_t j = 0; j < k; ++j) {
    acc = fmaf(weights[r * k + j], AsFloat(y[int64_t{positions[r * k + j]} * n + c]), acc);
  }
  Store(acc, out + r * n + c);
}

}  // namespace

template <typename T>
cudaError_t MoeGather(const T* x, const int32_t* sorted_slots, int64_t slots, int32_t k, int64_t n, T* out,
                      cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (slots < 1 || slots > INT32_MAX || k < 1 || n < 8 || n % 8 != 0 || !aligned(x) || !aligned(out)) {
    return cudaErrorInvalidValue;
  }
  return LaunchDependent(GatherKernel<T>, static_cast<unsigned>(slots), kVecThreads, stream, x, sorted_slots, k, n,
                         out);
}

template <typename T>
cudaError_t MoeCombine(const T* y, const int32_t* slot_positions, const float* topk_weights, int64_t rows, int32_t k,
                       int64_t n, T* out, cudaStream_t stream) {
  const int64_t tiles = (n + kVecThreads - 1) / kVecThreads;
  if (rows < 1 || rows > INT32_MAX || k < 1 || k > kMoeMaxTopK || n < 1 || tiles > 65535) return cudaErrorInvalidValue;
  return LaunchDependent(CombineKernel<T>, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(tiles)), kVecThreads,
                         stream, y, slot_positions, topk_weights, k, n, out);
}

template cudaError_t MoeGather(const __nv_bfloat16*, const int32_t*, int64_t, int32_t, int64_t, __nv_bfloat16*,
                               cudaStream_t);
template cudaError_t MoeGather(const __half*, const int32_t*, int64_t, int32_t, int64_t, __half*, cudaStream_t);
template cudaError_t MoeCombine(const __nv_bfloat16*, const int32_t*, const float*, int64_t, int32_t, int64_t,
                                __nv_bfloat16*, cudaStream_t);
template cudaError_t MoeCombine(const __half*, const int32_t*, const float*, int64_t, int32_t, int64_t, __half*,
                                cudaStream_t);

}  // namespace inferd::kernels

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/block_reduce.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.h"
#include "kernels/float_convert.cuh"
#include "kernels/row_access.cuh"

namespace inferd::kernels {
namespace {

cudaError_t Check(int64_t rows) {
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  return cudaSuccess;
}

template <typename T>
__global__ void GatherRowsKernel(const T* __restrict__ src, const int32_t* __restrict__ rows, T* __restrict__ dst,
                                 int64_t cols) {
  const T* s = src + int64_t{rows[blockIdx.x]} * cols;
  T* d = dst + int64_t{blockIdx.x} * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
}

template <typename T>
__global__ void EmbedTokensKernel(const T* __restrict__ embed, const int32_t* __restrict__ ids,
                                  const int32_t* __restrict__ sampled, T* __restrict__ dst, int64_t cols, float scale) {
  int32_t id = ids[blockIdx.x];
  if (id < 0) id = sampled[-1 - id];
  const T* s = embed + int64_t{id} * cols;
  T* d = dst + int64_t{blockIdx.x} * cols;
  if (scale == 1.f) {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
  } else {
    const float k = Round<T>(scale);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) d[i] = To<T>(F(s[i]) * k);
  }
}

constexpr int kNormThreads = 256;

template <typename T>
__global__ void AddRmsNormKernel(T* __restrict__ residual, const T* __restrict__ delta, const T* __restrict__ weight,
                                 T* __restrict__ out, int64_t n, float eps) {
  WaitForPrerequisites();
  T* x = residual + int64_t{blockIdx.x} * n;
  const T* d = delta ? delta + int64_t{blockIdx.x} * n : nullptr;
  T* o = out + int64_t{blockIdx.x} * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    float v = F(x[i]);
    if (d) {
      v = Round<T>(v + F(d[i]));
      x[i] = To<T>(v);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum<kNormThreads>(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) o[i] = To<T>(F(weight[i]) * Round<T>(F(x[i]) * inv));
}

// One thread per output element over all rows: a decode step's few rows still spread over the whole GPU.
// The same with 16-byte accesses, each row read once into registers: up to kVecs vectors of 8 per thread, for rows
// of n % 8 == 0 and n ≤ kNormVecThreads · kVecs · 8. One block per row still, but no serial chain of loads.
constexpr int kNormVecThreads = 512;
constexpr int kNormVecs = 4;

template <typename T>
__global__ void __launch_bounds__(kNormVecThreads)
    AddRmsNormVecKernel(T* __restrict__ residual, const T* __restrict__ delta, const T* __restrict__ weight,
                        T* __restrict__ out, int64_t n, float eps) {
  AllowDependentsToLaunch();  // the product after the norm may start streaming its weights
  WaitForPrerequisites();
  float v[kNormVecs][8];
  const float ss = AddResidualRow<T, kNormVecThreads, kNormVecs>(residual, delta, n, v);
  const float inv = rsqrtf(BlockSum<kNormVecThreads>(ss) / static_cast<float>(n) + eps);
  StoreNormedRow<T, kNormVecThreads, kNormVecs>(v, inv, weight, out + int64_t{blockIdx.x} * n, n);
}

template <typename T, int A>
__global__ void ActivateMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int64_t inter) {
  AllowDependentsToLaunch();  // the down product may start streaming its weights
  WaitForPrerequisites();
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= rows * inter) return;
  const int64_t r = e / inter, i = e % inter;
  const T* g = gate_up + r * 2 * inter;
  out[e] = To<T>(Round<T>(Activate<A>(F(g[i]))) * F(g[inter + i]));
}

// The same with 8 elements per thread in 16-byte loads and stores (inter a multiple of 8, rows 16-byte aligned).
template <typename T, int A>
__global__ void ActivateMulVec8Kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int64_t inter) {
  AllowDependentsToLaunch();
  WaitForPrerequisites();
  const int64_t v = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, per_row = inter / 8;
  if (v >= rows * per_row) return;
  const int64_t r = v / per_row, i = (v % per_row) * 8;
  const uint4 gv = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + i);
  const uint4 uv = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + inter + i);
  const T* g = reinterpret_cast<const T*>(&gv);
  const T* u = reinterpret_cast<const T*>(&uv);
  uint4 ov;
  T* o = reinterpret_cast<T*>(&ov);
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = To<T>(Round<T>(Activate<A>(F(g[e]))) * F(u[e]));
  *reinterpret_cast<uint4*>(out + r * inter + i) = ov;
}

// A value of the activation dtype T as the cache stores it: itself, or divided by the cache's scale and rounded to
// e4m3 (saturating).
template <typename C, typename T>
__device__ __forceinline__ C ToCache(T v, float scale) {
  if constexpr (std::is_same_v<C, T>) {
    return v;
  } else {
    return C(F(v) / scale);
  }
}

// One warp per (token, q or k head), kRopeWarps heads a block: lane j rotates pairs j, j + 32, ... of that head; a k
// head's warp then writes K and V of its kv head into the token's slot. Where the family has per-head norms, the sum
// of squares associates as a block of `block_threads` threads took it (lane l adds what thread l + 32w did, each group
// of 32 is reduced, the groups' totals added in order), so every value is bit for bit that of the block-a-head kernel
// this replaced (checked on every option; kernels/NOTES.md) and, without norms, GemvQkvRope's.
constexpr int kRopeWarps = 4;

template <typename T, typename C>
__global__ void __launch_bounds__(kRopeWarps * 32)
    RopeWriteKvKernel(T* __restrict__ qkv, const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                      const float* __restrict__ inv_freq, C* __restrict__ k_cache, C* __restrict__ v_cache,
                      int64_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                      int32_t block_threads, float k_scale, float v_scale, RotaryOptions options) {
  AllowDependentsToLaunch();  // attention (a programmatic dependent) waits for this kernel before it reads q or K/V
  WaitForPrerequisites();
  const int32_t heads = num_heads + num_kv_heads, lane = static_cast<int32_t>(threadIdx.x % 32);
  const int64_t g = int64_t{blockIdx.x} * kRopeWarps + threadIdx.x / 32;
  if (g >= num_tokens * heads) return;  // a whole warp
  const int64_t t = g / heads;
  const int32_t h = static_cast<int32_t>(g % heads);  // q heads, then k heads
  const int32_t rotary = options.rotary_dim > 0 ? options.rotary_dim : head_dim, half = rotary / 2;
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  T* head = qkv + t * (int64_t{num_heads} * head_dim + 2 * kv_dim) + int64_t{h} * head_dim;
  const float pos = static_cast<float>(positions[t]);
  const float* freq = options.inv_freq_long && positions[t] >= options.long_from ? options.inv_freq_long : inv_freq;
  const bool is_k = h >= num_heads;
  const int64_t kv_off = (is_k ? int64_t{slots[t]} : 0) * kv_dim + int64_t{h - num_heads} * head_dim;
  const T* norm = static_cast<const T*>(is_k ? options.k_norm : options.q_norm);
  float inv = 0.f;
  if (norm) {  // each group of 32 virtual threads reduced, lane 0's total taken (as a block's partial), in order
    float total = 0.f;
    for (int32_t w = 0; w * 32 < block_threads; ++w) {
      float ss = 0.f;
      for (int32_t j = w * 32 + lane; j < head_dim; j += block_threads) ss += F(head[j]) * F(head[j]);
      for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffff, ss, offset);
      total += __shfl_sync(0xffffffff, ss, 0);
    }
    inv = rsqrtf(total / static_cast<float>(head_dim) + options.norm_eps);
  }
  const auto value = [&](int32_t j) { return norm ? Round<T>(F(norm[j]) * Round<T>(F(head[j]) * inv)) : F(head[j]); };
  for (int32_t j = lane; j < half; j += 32) {
    const float angle = pos * freq[j];
    const float c = Round<T>(cosf(angle) * options.mscale), s = Round<T>(sinf(angle) * options.mscale);
    const float a = value(j), b = value(j + half);
    const T ra = To<T>(a * c - b * s), rb = To<T>(b * c + a * s);
    head[j] = ra;
    head[j + half] = rb;
    if (is_k) {
      k_cache[kv_off + j] = ToCache<C>(ra, k_scale);
      k_cache[kv_off + j + half] = ToCache<C>(rb, k_scale);
    }
  }
  for (int32_t j = rotary + lane; j < head_dim; j += 32) {  // the dimensions past the rotary ones
    const T v = To<T>(value(j));
    head[j] = v;
    if (is_k) k_cache[kv_off + j] = ToCache<C>(v, k_scale);
  }
  if (!is_k) return;
  const T* v = head + kv_dim;  // the same kv head's V
  for (int32_t j = lane; j < head_dim; j += 32) v_cache[kv_off + j] = ToCache<C>(v[j], v_scale);
}

}  // namespace

template <typename T>
cudaError_t GatherRows(const T* src, const int32_t* rows, T* dst, int64_t num_rows, int64_t cols, cudaStream_t stream) {
  if (num_rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(num_rows); e != cudaSuccess) return e;
  GatherRowsKernel<T><<<static_cast<unsigned>(num_rows), 256, 0, stream>>>(src, rows, dst, cols);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbedTokens(const T* embed, const int32_t* ids, const int32_t* sampled, T* dst, int64_t num_rows,
                        int64_t cols, cudaStream_t stream, float scale) {
  if (num_rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(num_rows); e != cudaSuccess) return e;
  EmbedTokensKernel<T><<<static_cast<unsigned>(num_rows), 256, 0, stream>>>(embed, ids, sampled, dst, cols, scale);
  return cudaGetLastError();
}

template <typename T>
cudaError_t AddRmsNorm(T* residual, const T* delta, const T* weight, T* out, int64_t rows, int64_t n, float eps,
                       cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(rows); e != cudaSuccess) return e;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (n % 8 == 0 && n <= int64_t{kNormVecThreads} * kNormVecs * 8 && aligned(residual) && aligned(delta) &&
      aligned(weight) && aligned(out)) {
    return LaunchDependent(AddRmsNormVecKernel<T>, static_cast<unsigned>(rows), kNormVecThreads, stream, residual,
                           delta, weight, out, n, eps);
  }
  return LaunchDependent(AddRmsNormKernel<T>, static_cast<unsigned>(rows), kNormThreads, stream, residual, delta,
                         weight, out, n, eps);
}

template <typename T, int A>
cudaError_t LaunchActivateMul(const T* gate_up, T* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (inter % 8 == 0 && aligned(gate_up) && aligned(out)) {
    const int64_t blocks = (rows * inter / 8 + 255) / 256;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    return LaunchDependent(ActivateMulVec8Kernel<T, A>, static_cast<unsigned>(blocks), 256, stream, gate_up, out, rows,
                           inter);
  }
  const int64_t blocks = (rows * inter + 255) / 256;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchDependent(ActivateMulKernel<T, A>, static_cast<unsigned>(blocks), 256, stream, gate_up, out, rows,
                         inter);
}

template <typename T>
cudaError_t ActivateMul(const T* gate_up, T* out, int64_t rows, int64_t inter, GatedActivation act,
                        cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cudaError_t e = Check(rows); e != cudaSuccess) return e;
  switch (act) {
    case GatedActivation::kSilu:
      return LaunchActivateMul<T, 0>(gate_up, out, rows, inter, stream);
    case GatedActivation::kGeluTanh:
      return LaunchActivateMul<T, 1>(gate_up, out, rows, inter, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T, typename C>
cudaError_t RopeWriteKv(T* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq, C* k_cache,
                        C* v_cache, int64_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                        float k_scale, float v_scale, cudaStream_t stream, const RotaryOptions& options) {
  if (num_tokens <= 0) return cudaSuccess;
  const int32_t rotary = options.rotary_dim > 0 ? options.rotary_dim : head_dim;
  if (head_dim % 2 != 0 || rotary % 2 != 0 || rotary > head_dim || !(options.mscale > 0.f)) {
    return cudaErrorInvalidValue;
  }
  // A cache of the activation dtype holds the values themselves; an fp8 cache's scales are finite and positive.
  if (std::is_same_v<C, T> ? (k_scale != 1.f || v_scale != 1.f)
                           : !(k_scale > 0.f && v_scale > 0.f && std::isfinite(k_scale) && std::isfinite(v_scale))) {
    return cudaErrorInvalidValue;
  }
  if (cudaError_t e = Check(num_tokens); e != cudaSuccess) return e;
  const int32_t block_threads = std::min((head_dim / 2 + 31) / 32 * 32, 128);  // the norm's summation order
  const int64_t blocks = (num_tokens * (num_heads + num_kv_heads) + kRopeWarps - 1) / kRopeWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchDependent(RopeWriteKvKernel<T, C>, static_cast<unsigned>(blocks), kRopeWarps * 32, stream, qkv,
                         positions, slots, inv_freq, k_cache, v_cache, num_tokens, num_heads, num_kv_heads, head_dim,
                         block_threads, k_scale, v_scale, options);
}

namespace {

__global__ void SoftCapKernel(float* __restrict__ x, int64_t n, float cap) {
  WaitForPrerequisites();
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

}  // namespace

cudaError_t SoftCap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n < 0 || !(cap > 0.f)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  return LaunchDependent(SoftCapKernel, static_cast<unsigned>(blocks), 256, stream, x, n, cap);
}

#define INFERD_INSTANTIATE(T)                                                                                          \
  template cudaError_t GatherRows<T>(const T*, const int32_t*, T*, int64_t, int64_t, cudaStream_t);                    \
  template cudaError_t EmbedTokens<T>(const T*, const int32_t*, const int32_t*, T*, int64_t, int64_t, cudaStream_t,    \
                                      float);                                                                          \
  template cudaError_t AddRmsNorm<T>(T*, const T*, const T*, T*, int64_t, int64_t, float, cudaStream_t);               \
  template cudaError_t ActivateMul<T>(const T*, T*, int64_t, int64_t, GatedActivation, cudaStream_t);                  \
  template cudaError_t RopeWriteKv<T, T>(T*, const int32_t*, const int32_t*, const float*, T*, T*, int64_t, int32_t,   \
                                         int32_t, int32_t, float, float, cudaStream_t, const RotaryOptions&);          \
  template cudaError_t RopeWriteKv<T, __nv_fp8_e4m3>(T*, const int32_t*, const int32_t*, const float*, __nv_fp8_e4m3*, \
                                                     __nv_fp8_e4m3*, int64_t, int32_t, int32_t, int32_t, float, float, \
                                                     cudaStream_t, const RotaryOptions&);
INFERD_INSTANTIATE(__nv_bfloat16)
INFERD_INSTANTIATE(__half)
#undef INFERD_INSTANTIATE

}  // namespace inferd::kernels

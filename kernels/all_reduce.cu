#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/all_reduce.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/float_convert.cuh"
#include "kernels/row_access.cuh"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxBlocks = 32;  // of a plain sum: 8 ranks sharing one GPU must all fit on it at once
// Of a sum fused with the norm, one row a block: up to this many rows at once on a GPU of its own (a decode step's
// rows, each block resident at once on any data-centre GPU), kMaxBlocks where the ranks share one.
constexpr int kMaxRowBlocks = 128;
constexpr int kNormVecs = 4;  // vectors of 8 per thread: rows of up to kThreads · kNormVecs · 8 elements

// Inbox traffic: stores to a peer's memory and loads of what peers store into ours, at system scope (never from a
// cache line of an earlier call's).
__device__ __forceinline__ void StoreSys(uint4* p, uint4 v) {
  asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void StoreSys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void StoreSys(uint16_t* p, uint16_t v) {
  asm volatile("st.relaxed.sys.global.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}
__device__ __forceinline__ uint4 LoadSys(const uint4* p) {
  uint4 v;
  asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LoadSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint16_t LoadSys(const uint16_t* p) {
  uint16_t v;
  asm volatile("ld.relaxed.sys.global.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}

// The units a message moves in: 8 elements of 2 bytes, one element (a tail), or one broadcast word. The empty
// mark is all ones in every element (every word); Full turns an element that happens to be all ones into one that
// is not.
__device__ __forceinline__ bool HasEmpty(uint32_t w) {
  return (w & 0xFFFFu) == 0xFFFFu || (w >> 16) == 0xFFFFu;
}
__device__ __forceinline__ bool IsEmpty(uint4 v) {
  return HasEmpty(v.x) || HasEmpty(v.y) || HasEmpty(v.z) || HasEmpty(v.w);
}
__device__ __forceinline__ bool IsEmpty(uint16_t v) {
  return v == 0xFFFFu;
}
__device__ __forceinline__ bool IsEmpty(uint32_t v) {
  return v == 0xFFFFFFFFu;
}
__device__ __forceinline__ uint32_t FullPair(uint32_t w) {  // two elements
  if ((w & 0xFFFFu) == 0xFFFFu) w &= 0xFFFF7FFFu;
  if ((w >> 16) == 0xFFFFu) w &= 0x7FFFFFFFu;
  return w;
}
__device__ __forceinline__ uint4 Full(uint4 v) {
  return {FullPair(v.x), FullPair(v.y), FullPair(v.z), FullPair(v.w)};
}
__device__ __forceinline__ uint16_t Full(uint16_t v) {
  return v == 0xFFFFu ? 0x7FFFu : v;
}
template <typename U>
__device__ __forceinline__ U Empty() {
  if constexpr (sizeof(U) == 16) {
    return {~0u, ~0u, ~0u, ~0u};
  } else {
    return static_cast<U>(~U{0});
  }
}

// src's message of this call in dst's inbox, as units U.
template <typename U>
__device__ __forceinline__ U* Inbox(const PeerGroup& g, int dst, int src, uint32_t slot) {
  return reinterpret_cast<U*>(g.inboxes[dst] + (int64_t{slot} * g.size + src) * g.capacity_bytes);
}

// This call's slot: read after the kernels before it (the previous call among them) have ended.
__device__ __forceinline__ uint32_t CallSlot(const PeerGroup& g) {
  return LoadSys(g.calls) & 1;  // not from an L1 line of a kernel that ran on this SM before the last call ended
}

// The last block of the call to end advances the count, which the next call reads.
__device__ __forceinline__ void EndCall(const PeerGroup& g) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(g.calls + 1, 1u) == gridDim.x - 1) {
      g.calls[1] = 0;
      g.calls[0] += 1;
    }
  }
}

// Unit i of this rank's message into every peer's inbox.
template <typename U>
__device__ __forceinline__ void Push(const PeerGroup& g, uint32_t slot, int64_t i, U v) {
  v = Full(v);
  for (int p = 0; p < g.size; ++p) {
    if (p != g.rank) StoreSys(Inbox<U>(g, p, g.rank, slot) + i, v);
  }
}

// Unit i of src's message, once it has arrived; the inbox is emptied behind it.
template <typename U>
__device__ __forceinline__ U Take(const PeerGroup& g, int src, uint32_t slot, int64_t i) {
  U* p = Inbox<U>(g, g.rank, src, slot) + i;
  U v;
  do {
    v = LoadSys(p);
  } while (IsEmpty(v));
  StoreSys(p, Empty<U>());
  return v;
}

// The rank-order fp32 sum of unit i (this rank's own value `mine`), rounded to T.
template <typename T, typename U>
__device__ __forceinline__ U SumUnit(const PeerGroup& g, uint32_t slot, int64_t i, U mine) {
  constexpr int kN = sizeof(U) / sizeof(T);
  float acc[kN] = {};
  for (int r = 0; r < g.size; ++r) {
    const U v = r == g.rank ? mine : Take<U>(g, r, slot, i);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] += F(e[k]);
  }
  U out;
  T* e = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int k = 0; k < kN; ++k) e[k] = To<T>(acc[k]);
  return out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) AllReduceKernel(PeerGroup g, T* data, int64_t count) {
  WaitForPrerequisites();
  const uint32_t slot = CallSlot(g);
  const int64_t nvec = count / 8, tail = nvec * 8;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x, step = int64_t{gridDim.x} * kThreads;
  uint4* vec = reinterpret_cast<uint4*>(data);
  uint16_t* elem = reinterpret_cast<uint16_t*>(data);
  // Everything out first: no rank waits for a peer that is itself waiting to send.
  for (int64_t i = first; i < nvec; i += step) Push(g, slot, i, vec[i]);
  for (int64_t i = tail + first; i < count; i += step) Push(g, slot, i, elem[i]);
  for (int64_t i = first; i < nvec; i += step) vec[i] = SumUnit<T>(g, slot, i, vec[i]);
  for (int64_t i = tail + first; i < count; i += step) elem[i] = SumUnit<T>(g, slot, i, elem[i]);
  EndCall(g);
}

// One block a row (grid-strided): every row of the block out first, then each row summed as it arrives, added to
// the residual and normed (out in T, or with out null quantized into q and scales).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    AllReduceAddNormKernel(PeerGroup g, const T* __restrict__ delta, T* __restrict__ residual,
                           const T* __restrict__ weight, T* __restrict__ out, Fp8* __restrict__ q,
                           float* __restrict__ scales, int64_t rows, int64_t n, float eps) {
  // Every block of this call is resident once the trigger fires: the product after the norm may start streaming
  // its weights while the rows travel (not where the ranks share a GPU, whose SMs a peer's call may still need).
  if (!g.one_gpu) AllowDependentsToLaunch();
  WaitForPrerequisites();
  const uint32_t slot = CallSlot(g);
  const int64_t nv = n / 8;
  const uint4* d = reinterpret_cast<const uint4*>(delta);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (int64_t i = threadIdx.x; i < nv; i += kThreads) Push(g, slot, r * nv + i, d[r * nv + i]);
  }
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    uint4* x = reinterpret_cast<uint4*>(residual + r * n);
    float v[kNormVecs][8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kNormVecs; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kThreads;
      if (i >= nv) break;
      const uint4 sum = SumUnit<T>(g, slot, r * nv + i, d[r * nv + i]);
      const T* se = reinterpret_cast<const T*>(&sum);
      uint4 xv = x[i];
      T* xe = reinterpret_cast<T*>(&xv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        xe[e] = To<T>(F(xe[e]) + F(se[e]));
        v[j][e] = F(xe[e]);
        ss += v[j][e] * v[j][e];
      }
      x[i] = xv;
    }
    const float inv = rsqrtf(BlockSum<kThreads>(ss) / static_cast<float>(n) + eps);
    if (out) {
      StoreNormedRow<T, kThreads, kNormVecs>(v, inv, weight, out + r * n, n);
    } else {
      QuantizeNormedRow<T, kThreads, kNormVecs>(v, inv, weight, q + r * n, scales + r, n);
    }
  }
  EndCall(g);
}

__global__ void __launch_bounds__(kThreads) BroadcastKernel(PeerGroup g, uint32_t* data, int64_t words) {
  WaitForPrerequisites();
  const uint32_t slot = CallSlot(g);
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x, step = int64_t{gridDim.x} * kThreads;
  for (int64_t i = first; i < words; i += step) {
    if (g.rank == 0) {  // words go as they are: none is all ones
      for (int p = 1; p < g.size; ++p) StoreSys(Inbox<uint32_t>(g, p, 0, slot) + i, data[i]);
    } else {
      data[i] = Take<uint32_t>(g, 0, slot, i);
    }
  }
  EndCall(g);
}

__global__ void JoinKernel(PeerGroup g) {
  if (g.rank != 0) {  // everything this rank wrote before is visible at system scope before the count moves
    __threadfence_system();
    atomicAdd_system(g.joins + g.rank, 1u);
    return;
  }
  const uint32_t call = g.joins[0] + 1;  // only rank 0 writes its own count
  for (int r = 1; r < g.size; ++r) {
    uint32_t seen;
    do {
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(g.joins + r) : "memory");
    } while (static_cast<int32_t>(seen - call) < 0);
  }
  g.joins[0] = call;
}

unsigned Blocks(int64_t units) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, (units + kThreads - 1) / kThreads)));
}

}  // namespace

template <typename T>
cudaError_t PeerAllReduceSum(const PeerGroup& group, T* data, int64_t count, cudaStream_t stream) {
  if (count * static_cast<int64_t>(sizeof(T)) > group.capacity_bytes || group.size > kPeerMaxRanks ||
      reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  return LaunchDependent(AllReduceKernel<T>, Blocks(count / 8 + count % 8), kThreads, stream, group, data, count);
}

bool PeerAllReduceAddRmsNormSupports(int64_t n) {
  return n > 0 && n % 8 == 0 && n <= int64_t{kThreads} * kNormVecs * 8;
}

template <typename T>
cudaError_t PeerAllReduceAddRmsNorm(const PeerGroup& group, const T* delta, T* residual, const T* weight, T* out,
                                    Fp8* q, float* scales, int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (rows <= 0 || !PeerAllReduceAddRmsNormSupports(n) ||
      rows * n * static_cast<int64_t>(sizeof(T)) > group.capacity_bytes || group.size > kPeerMaxRanks ||
      !aligned(delta) || !aligned(residual) || !aligned(weight) ||
      (out ? !aligned(out) : (!q || !scales || reinterpret_cast<uintptr_t>(q) % 8 != 0))) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = std::min<int64_t>(rows, group.one_gpu ? kMaxBlocks : kMaxRowBlocks);
  return LaunchDependent(AllReduceAddNormKernel<T>, static_cast<unsigned>(blocks), kThreads, stream, group, delta,
                         residual, weight, out, q, scales, rows, n, eps);
}

cudaError_t PeerBroadcast(const PeerGroup& group, uint32_t* data, int64_t words, cudaStream_t stream) {
  if (words * 4 > group.capacity_bytes || group.size > kPeerMaxRanks) return cudaErrorInvalidValue;
  return LaunchDependent(BroadcastKernel, Blocks(words), kThreads, stream, group, data, words);
}

cudaError_t PeerJoinRank0(const PeerGroup& group, cudaStream_t stream) {
  if (group.size > kPeerMaxRanks || !group.joins) return cudaErrorInvalidValue;
  JoinKernel<<<1, 1, 0, stream>>>(group);
  return cudaGetLastError();
}

template cudaError_t PeerAllReduceSum<__nv_bfloat16>(const PeerGroup&, __nv_bfloat16*, int64_t, cudaStream_t);
template cudaError_t PeerAllReduceSum<__half>(const PeerGroup&, __half*, int64_t, cudaStream_t);
template cudaError_t PeerAllReduceAddRmsNorm<__nv_bfloat16>(const PeerGroup&, const __nv_bfloat16*, __nv_bfloat16*,
                                                            const __nv_bfloat16*, __nv_bfloat16*, Fp8*, float*, int64_t,
                                                            int64_t, float, cudaStream_t);
template cudaError_t PeerAllReduceAddRmsNorm<__half>(const PeerGroup&, const __half*, __half*, const __half*, __half*,
                                                     Fp8*, float*, int64_t, int64_t, float, cudaStream_t);

}  // namespace inferd::kernels

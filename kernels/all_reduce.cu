#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/all_reduce.h"
#include "kernels/float_convert.cuh"

namespace inferd::kernels {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Staging written by another GPU during this kernel: read at system scope, never from a cache line of an earlier
// call's.
__device__ __forceinline__ uint4 LoadPeer(const uint4* p) {
  uint4 v;
  asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LoadPeer(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint16_t LoadPeer(const uint16_t* p) {
  uint16_t v;
  asm volatile("ld.relaxed.sys.global.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}

// Block b's barrier of call `call`: its flag in every peer's array, then every peer's in its own.
__device__ void Barrier(const PeerGroup& g, int b, uint32_t call) {
  __syncthreads();                                      // the block's staging writes are done
  if (threadIdx.x < g.size && threadIdx.x != g.rank) {  // thread p: peer p's flag, then its in ours
    __threadfence_system();
    StoreRelease(g.flags[threadIdx.x] + b * kPeerMaxRanks + g.rank, call);
    const uint32_t* mine = g.flags[g.rank] + b * kPeerMaxRanks + threadIdx.x;
    // Wrap-safe: a peer may already be one call ahead.
    while (static_cast<int32_t>(LoadAcquire(mine) - call) < 0) {
    }
  }
  __syncthreads();
}

// This block's slice of n units: [begin, end).
__device__ void Slice(int64_t n, int64_t* begin, int64_t* end) {
  const int64_t per = (n + kPeerBlocks - 1) / kPeerBlocks;
  *begin = min(n, per * blockIdx.x);
  *end = min(n, *begin + per);
}

// The sum over the ranks, 8 elements (one 16-byte vector) at a time, in rank order.
template <typename T>
__global__ void __launch_bounds__(kThreads) AllReduceKernel(PeerGroup g, T* data, int64_t count) {
  const int b = blockIdx.x;
  const uint32_t call = g.counters[b] + 1;
  const int64_t half = (call & 1) * g.capacity_bytes;
  constexpr int kVec = 8;
  const int64_t nvec = count / kVec;
  int64_t begin, end;
  Slice(nvec, &begin, &end);
  uint4* mine = reinterpret_cast<uint4*>(g.staging[g.rank] + half);
  const uint4* in = reinterpret_cast<const uint4*>(data);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) mine[i] = in[i];
  // The tail past the last whole vector: block 0's.
  const int64_t tail = nvec * kVec;
  T* mine_t = reinterpret_cast<T*>(g.staging[g.rank] + half);
  if (b == 0)
    for (int64_t i = tail + threadIdx.x; i < count; i += kThreads) mine_t[i] = data[i];
  Barrier(g, b, call);
  uint4* out = reinterpret_cast<uint4*>(data);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float acc[kVec] = {};
    for (int r = 0; r < g.size; ++r) {
      const uint4 v = LoadPeer(reinterpret_cast<const uint4*>(g.staging[r] + half) + i);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += F(e[k]);
    }
    uint4 v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) e[k] = To<T>(acc[k]);
    out[i] = v;
  }
  if (b == 0) {
    for (int64_t i = tail + threadIdx.x; i < count; i += kThreads) {
      float acc = 0;
      for (int r = 0; r < g.size; ++r) {
        const uint16_t bits = LoadPeer(reinterpret_cast<const uint16_t*>(g.staging[r] + half) + i);
        acc += F(*reinterpret_cast<const T*>(&bits));
      }
      data[i] = To<T>(acc);
    }
  }
  if (threadIdx.x == 0) g.counters[b] = call;
}

__global__ void __launch_bounds__(kThreads) BroadcastKernel(PeerGroup g, uint32_t* data, int64_t words) {
  const int b = blockIdx.x;
  const uint32_t call = g.counters[b] + 1;
  const int64_t half = (call & 1) * g.capacity_bytes;
  int64_t begin, end;
  Slice(words, &begin, &end);
  if (g.rank == 0) {
    uint32_t* mine = reinterpret_cast<uint32_t*>(g.staging[0] + half);
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) mine[i] = data[i];
  }
  Barrier(g, b, call);
  if (g.rank != 0) {
    const uint32_t* root = reinterpret_cast<const uint32_t*>(g.staging[0] + half);
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) data[i] = LoadPeer(root + i);
  }
  if (threadIdx.x == 0) g.counters[b] = call;
}

}  // namespace

int64_t PeerStagingBytes(int64_t capacity_bytes) {
  return 2 * capacity_bytes;
}
int64_t PeerFlagBytes() {
  return int64_t{kPeerBlocks} * kPeerMaxRanks * sizeof(uint32_t);
}
int64_t PeerCounterBytes() {
  return int64_t{kPeerBlocks} * sizeof(uint32_t);
}

template <typename T>
cudaError_t PeerAllReduceSum(const PeerGroup& group, T* data, int64_t count, cudaStream_t stream) {
  if (count * static_cast<int64_t>(sizeof(T)) > group.capacity_bytes || group.size > kPeerMaxRanks ||
      reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  AllReduceKernel<T><<<kPeerBlocks, kThreads, 0, stream>>>(group, data, count);
  return cudaGetLastError();
}

cudaError_t PeerBroadcast(const PeerGroup& group, uint32_t* data, int64_t words, cudaStream_t stream) {
  if (words * 4 > group.capacity_bytes || group.size > kPeerMaxRanks) return cudaErrorInvalidValue;
  BroadcastKernel<<<kPeerBlocks, kThreads, 0, stream>>>(group, data, words);
  return cudaGetLastError();
}

template cudaError_t PeerAllReduceSum<__nv_bfloat16>(const PeerGroup&, __nv_bfloat16*, int64_t, cudaStream_t);
template cudaError_t PeerAllReduceSum<__half>(const PeerGroup&, __half*, int64_t, cudaStream_t);

}  // namespace inferd::kernels

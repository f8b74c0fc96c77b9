// The one-shot peer collectives' device memory for tests (kernels/all_reduce.h): a group of ranks sharing this GPU,
// or each on a GPU of its own, with a stream each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/all_reduce.h"

namespace inferd::testing {

inline int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// The group's device memory: inboxes and call counters per rank, all on this GPU or (own_gpus) rank r's on GPU r.
class PeerTestGroup {
 public:
  PeerTestGroup(int n, int64_t capacity, bool own_gpus = false) : own_gpus_(own_gpus) {
    char* inboxes[kernels::kPeerMaxRanks] = {};
    uint32_t* calls[kernels::kPeerMaxRanks] = {};
    for (int r = 0; r < n && own_gpus; ++r) {
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        cudaSetDevice(r);
        const cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
        EXPECT_TRUE(e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) << cudaGetErrorString(e);
        cudaGetLastError();
      }
    }
    for (int r = 0; r < n; ++r) {
      Use(r);
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, kernels::PeerInboxBytes(capacity, n)), cudaSuccess);
      cudaMemset(p, 0xFF, kernels::PeerInboxBytes(capacity, n));
      inboxes[r] = static_cast<char*>(p);
      allocations_.push_back(p);
      EXPECT_EQ(cudaMalloc(&p, kernels::kPeerCallBytes), cudaSuccess);
      cudaMemset(p, 0, kernels::kPeerCallBytes);
      calls[r] = static_cast<uint32_t*>(p);
      allocations_.push_back(p);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      streams.push_back(s);
    }
    Synchronize();
    for (int r = 0; r < n; ++r) {
      kernels::PeerGroup& g = groups.emplace_back();
      g.rank = r;
      g.size = n;
      g.capacity_bytes = capacity;
      for (int q = 0; q < n; ++q) g.inboxes[q] = inboxes[q];
      g.calls = calls[r];
      g.joins = calls[0] + 2;
      g.one_gpu = !own_gpus;
    }
    Use(0);
  }
  ~PeerTestGroup() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    for (void* p : allocations_) cudaFree(p);
    Use(0);
  }
  // Makes rank r's GPU the current one.
  void Use(int r) const {
    if (own_gpus_) cudaSetDevice(r);
  }
  cudaError_t Synchronize() const {
    cudaError_t first = cudaSuccess;
    for (int r = 0; r < (own_gpus_ ? static_cast<int>(streams.size()) : 1); ++r) {
      Use(r);
      const cudaError_t e = cudaDeviceSynchronize();
      if (first == cudaSuccess) first = e;
    }
    Use(0);
    return first;
  }
  std::vector<kernels::PeerGroup> groups;
  std::vector<cudaStream_t> streams;

 private:
  bool own_gpus_;
  std::vector<void*> allocations_;
};

}  // namespace inferd::testing

// The sums and broadcasts between the ranks of a tensor-parallel model (engine.tensor_parallel_size > 1). Two
// ways, per message size:
// - NCCL, loaded when the first communicator is made (a server on one GPU neither needs nor loads it), with
//   NVLink multicast (NVLS) kept off;
// - the one-shot peer kernels (kernels/all_reduce.h) where every rank's GPU can address every other's memory:
//   one kernel per call, for the decode-sized messages where NCCL's fixed cost dominates. Which way takes a size
//   is chosen by measurement at start-up (ChoosePeerLimit); NCCL's ring (reduce-scatter and all-gather) takes the
//   larger messages.
// The ranks are threads of this process, one per GPU: all their communicators are made together here, and each
// rank's thread enqueues its own calls on its own stream (both ways need every rank's call of a collective in
// flight at once). Calls capture into the ranks' decode graphs like any kernel. As with NCCL, a rank that fails or
// skips a call leaves the others waiting for it on the device: calls fail only on sizes the start-up checked.
// Ranks that share one GPU (tests of the tensor-parallel arithmetic on one GPU; NCCL takes one rank per GPU) use
// the peer kernels for every message, without graphs: before each call every rank's stream waits for every other
// rank's work so far (events, after a barrier of the ranks' threads). Otherwise a rank's kernel waiting in the
// peer barrier could hold SMs that another rank's GEMM on the same GPU needs all of at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/device_buffer.h"
#include "kernels/all_reduce.h"

namespace inferd::cuda {

class Collectives {
 public:
  // One per rank, rank r on device devices[r]: NCCL communicators where the devices differ, and, with
  // peer_capacity_bytes > 0 where every pair of devices can reach each other's memory (or all are one device), the
  // peer kernels' buffers for messages of up to that many bytes. Ranks sharing a device get the peer kernels only,
  // for every message: peer_capacity_bytes must then cover the largest.
  static absl::StatusOr<std::vector<std::unique_ptr<Collectives>>> Create(const std::vector<int>& devices,
                                                                          int64_t peer_capacity_bytes);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool has_nccl() const { return comm_ != nullptr; }
  bool has_peer() const { return peer_.inboxes[0] != nullptr; }
  // Messages of up to this many bytes go through the peer kernels, larger ones through NCCL.
  void set_peer_limit_bytes(int64_t bytes) { peer_limit_ = bytes; }

  // In place: every rank's `count` bf16 (or fp16) elements at `data` become their sum over the ranks.
  absl::Status AllReduceSum(void* data, int64_t count, bool bf16, cudaStream_t stream) const;
  // Whether AllReduceAddRmsNorm takes `rows` rows of n elements: the peer kernels take a sum of that size.
  bool FusesAddRmsNorm(int64_t rows, int64_t n) const;
  // The sum of every rank's `delta` rows added to the residual stream and normed, in one kernel (as AllReduceSum
  // then kernels::AddRmsNorm, or with `out` null kernels::AddRmsNormFp8 into q and scales, bit for bit):
  // kernels::PeerAllReduceAddRmsNorm. Only where FusesAddRmsNorm.
  absl::Status AllReduceAddRmsNorm(const void* delta, void* residual, const void* weight, void* out, kernels::Fp8* q,
                                   float* scales, int64_t rows, int64_t n, float eps, bool bf16,
                                   cudaStream_t stream) const;
  // Rank 0's `bytes` (a multiple of 4) at `data` land at every other rank's `data`.
  absl::Status Broadcast(void* data, int64_t bytes, cudaStream_t stream) const;
  // Whether every rank may write straight into rank 0's device memory (the GPUs reach each other's, or are one):
  // each rank then writes its part of a product (its vocabulary run of the logits) into rank 0's buffer and calls
  // JoinRank0.
  bool writes_to_rank0() const { return has_peer(); }
  // Every rank calls it after writing into rank 0's memory; rank 0's stream goes on once every peer's writes
  // before its call are there (kernels::PeerJoinRank0). A peer must not write there again before a later sum or
  // broadcast from rank 0.
  absl::Status JoinRank0(cudaStream_t stream) const;
  // Times a sum of `count` elements `iterations` times through NCCL and through the peer kernels on this rank's
  // stream (every rank must call it at once, with the same arguments); returns microseconds per call of each.
  absl::StatusOr<std::pair<double, double>> TimeAllReduce(void* data, int64_t count, bool bf16, int iterations,
                                                          cudaStream_t stream);

  struct Api;
  struct HostSync;

 private:
  Collectives() = default;
  // Ranks sharing a GPU: this stream waits for every rank's work queued so far.
  absl::Status AwaitPeers(cudaStream_t stream) const;
  absl::Status Nccl(void* data, int64_t count, bool bf16, cudaStream_t stream) const;

  const Api* api_ = nullptr;
  void* comm_ = nullptr;  // ncclComm_t; null without NCCL
  int device_ = 0, rank_ = 0, size_ = 1;
  kernels::PeerGroup peer_;  // no inboxes without the peer kernels
  int64_t peer_limit_ = 0;
  DeviceBuffer peer_inboxes_, peer_calls_;
  std::shared_ptr<HostSync> sync_;  // ranks sharing a GPU
  mutable uint64_t calls_ = 0;      // collectives this rank has made (ranks sharing a GPU)
};

}  // namespace inferd::cuda

// The KV pool on the device and the host pool beside it (swap space and the prefix cache's host tier). Per KV slot
// (a layer of each KV group, engine/model/kv_groups.h) K then V, each [num_blocks, block_size, num_kv_heads,
// head_dim] (FlashInfer's NHD pages); the last block is reserved for the padding rows of decode graphs and the
// pages a window group let go, outside the scheduler's pool. The host pool is pinned memory laid out [host
// block][slot][K, V][block]. Blocks move on a copy stream of their own (DMA, no SM time), one
// 2D copy per block; CUDA events order the copies after the steps launched before them, and a step that writes
// a block a copy still touches waits for that copy's event — nothing else waits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/device_layout.h"

namespace inferd::cuda {

class KvPool {
 public:
  KvPool() = default;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  // num_blocks, the reserved block included, of layout.kv_bytes_per_block each; any pool held before is freed first.
  absl::Status Allocate(const DeviceLayout& layout, int32_t num_blocks);
  void Free() { kv_ = DeviceBuffer(); }
  absl::Status AllocateHostBlocks(int32_t num_blocks);
  // Starts a batch on the copy stream after everything queued on `compute` so far: outs, then ins.
  absl::Status StartCopies(const CopyBatch& batch, cudaStream_t compute);
  // The ticket up to which every batch completed (polls their events).
  uint64_t CompletedCopies();
  absl::Status WaitForCopies(uint64_t ticket);
  // Before a step that writes the tokens at these slots is queued on `compute`: makes `compute` wait for the
  // last batch still touching one of their blocks, if any. Returns whether it had to.
  absl::StatusOr<bool> OrderWrites(std::span<const int32_t> slots, int32_t block_size, cudaStream_t compute);
  // Device time the copy stream spent on completed batches, and the part of it the steps' stream waited for (from
  // the wait's start on that stream to the batch's end), in seconds.
  double copy_busy_s() const { return copy_busy_s_; }
  double copy_waited_s() const { return copy_waited_s_; }
  // The device clock: milliseconds from the pool's allocation to a completed timed event (-1 if unavailable).
  double DeviceClockMs(cudaEvent_t e) const;
  // Completed batches on that clock since the last call (the last kMaxTimings of them).
  std::vector<CopyTiming> TakeTimings() {
    std::vector<CopyTiming> taken(timings_.begin(), timings_.end());
    timings_.clear();
    return taken;
  }
  static constexpr size_t kMaxTimings = 4096;

  bool allocated() const { return kv_.bytes() > 0; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t reserved_block() const { return num_blocks_ - 1; }
  int64_t bytes() const { return static_cast<int64_t>(kv_.bytes()); }
  char* data() const { return kv_.get<char>(); }
  int64_t layer_bytes() const { return int64_t{num_blocks_} * block_bytes_; }  // one slot's K (or V)

 private:
  DeviceBuffer kv_;
  int32_t num_blocks_ = 0;
  int32_t num_slots_ = 0;
  int64_t block_bytes_ = 0;  // K or V of one slot for one block
  absl::StatusOr<cudaEvent_t> TakeEvent();

  PinnedBuffer host_;
  int32_t num_host_blocks_ = 0;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // where the copies start on the steps' stream
  struct Batch {
    uint64_t ticket;
    int32_t blocks_out, blocks_in;
    cudaEvent_t start, done;       // on copy_, around its copies
    cudaEvent_t waited = nullptr;  // on the steps' stream where a step began waiting for it, if one did
  };
  std::deque<Batch> batches_;  // in flight, by ticket
  std::deque<Batch> timing_;   // completed, their time not yet counted (a step's wait for one still queued)
  std::vector<cudaEvent_t> spare_events_;
  double copy_busy_s_ = 0, copy_waited_s_ = 0;
  cudaEvent_t origin_ = nullptr;  // the device clock's zero, recorded once the pool is allocated
  std::deque<CopyTiming> timings_;
  std::vector<uint64_t> block_ticket_;  // [num_blocks]: the last batch that reads or writes each device block
  uint64_t completed_ = 0;
};

}  // namespace inferd::cuda

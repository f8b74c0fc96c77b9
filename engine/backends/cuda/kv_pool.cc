#include "engine/backends/cuda/kv_pool.h"

#include <algorithm>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/check.h"
#include "engine/status_macros.h"
#include "engine/trace.h"

namespace inferd::cuda {

KvPool::~KvPool() {
  if (copy_) cudaStreamSynchronize(copy_);
  for (const auto* list : {&batches_, &timing_}) {
    for (const Batch& b : *list) {
      for (cudaEvent_t e : {b.start, b.done, b.waited}) {
        if (e) cudaEventDestroy(e);
      }
    }
  }
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (compute_mark_) cudaEventDestroy(compute_mark_);
  if (origin_) cudaEventDestroy(origin_);
  if (copy_) cudaStreamDestroy(copy_);
}

absl::Status KvPool::Allocate(const DeviceLayout& layout, int32_t num_blocks) {
  kv_ = DeviceBuffer();
  num_blocks_ = num_blocks;
  num_slots_ = layout.kv_groups.slots;
  block_bytes_ = layout.kv_block_bytes;
  block_ticket_.assign(num_blocks, 0);
  INFERD_RETURN_IF_ERROR(kv_.Allocate(int64_t{num_blocks} * layout.kv_bytes_per_block));
  if (!origin_) {
    INFERD_CUDA(cudaEventCreate(&origin_));
    INFERD_CUDA(cudaEventRecord(origin_, nullptr));
    INFERD_CUDA(cudaEventSynchronize(origin_));
  }
  return absl::OkStatus();
}

double KvPool::DeviceClockMs(cudaEvent_t e) const {
  float ms = 0;
  return origin_ && cudaEventElapsedTime(&ms, origin_, e) == cudaSuccess ? ms : -1.0;
}

absl::Status KvPool::AllocateHostBlocks(int32_t num_blocks) {
  INFERD_CHECK(allocated(), "the KV pool is allocated before the host pool (it sets the block geometry)");
  INFERD_RETURN_IF_ERROR(host_.Allocate(int64_t{num_blocks} * 2 * num_slots_ * block_bytes_));
  num_host_blocks_ = num_blocks;
  if (!copy_) {
    INFERD_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    INFERD_CUDA(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  }
  return absl::OkStatus();
}

absl::Status KvPool::StartCopies(const CopyBatch& batch, cudaStream_t compute) {
  if (batch.empty()) return absl::OkStatus();
  INFERD_CHECK(copy_ && batch.ticket > (batches_.empty() ? completed_ : batches_.back().ticket),
               "copy batches come in ticket order, after the host pool is allocated");
  TraceRange range("start KV block copies");
  // A block is read (out) or overwritten (in) once every step queued before has run: one of them may still
  // write it (plan-ahead) or read it (a finished request's last step).
  INFERD_CUDA(cudaEventRecord(compute_mark_, compute));
  INFERD_CUDA(cudaStreamWaitEvent(copy_, compute_mark_, 0));
  Batch b{batch.ticket, static_cast<int32_t>(batch.out.size()), static_cast<int32_t>(batch.in.size()), nullptr,
          nullptr};
  INFERD_ASSIGN_OR_RETURN(b.start, TakeEvent());
  INFERD_ASSIGN_OR_RETURN(b.done, TakeEvent());
  INFERD_CUDA(cudaEventRecord(b.start, copy_));
  const int64_t rows = 2 * int64_t{num_slots_};  // K and V of every slot: one row each, layer_bytes apart
  char* host = host_.get<char>();
  for (const auto* copies : {&batch.out, &batch.in}) {
    const bool out = copies == &batch.out;
    for (const BlockCopy& c : *copies) {
      INFERD_CHECK(c.device_block >= 0 && c.device_block < reserved_block() && c.host_block >= 0 &&
                       c.host_block < num_host_blocks_,
                   "block copies name blocks of the pool and the host pool");
      char* dev = data() + int64_t{c.device_block} * block_bytes_;
      char* hst = host + int64_t{c.host_block} * rows * block_bytes_;
      if (out) {
        INFERD_CUDA(cudaMemcpy2DAsync(hst, block_bytes_, dev, layer_bytes(), block_bytes_, rows, cudaMemcpyDeviceToHost,
                                      copy_));
      } else {
        INFERD_CUDA(cudaMemcpy2DAsync(dev, layer_bytes(), hst, block_bytes_, block_bytes_, rows, cudaMemcpyHostToDevice,
                                      copy_));
      }
      block_ticket_[c.device_block] = batch.ticket;
    }
  }
  INFERD_CUDA(cudaEventRecord(b.done, copy_));
  batches_.push_back(b);
  return absl::OkStatus();
}

absl::StatusOr<cudaEvent_t> KvPool::TakeEvent() {
  cudaEvent_t e = nullptr;
  if (spare_events_.empty()) {
    INFERD_CUDA(cudaEventCreate(&e));  // timed: the copy time is measured between two of them
  } else {
    e = spare_events_.back();
    spare_events_.pop_back();
  }
  return e;
}

uint64_t KvPool::CompletedCopies() {
  while (!batches_.empty()) {
    Batch& b = batches_.front();
    if (cudaEventQuery(b.done) != cudaSuccess) break;  // not yet; or a failed copy, which the steps after report
    completed_ = b.ticket;
    timing_.push_back(b);  // its wait, if any, is measured once the steps' stream has passed it
    batches_.pop_front();
  }
  while (!timing_.empty()) {
    const Batch& b = timing_.front();
    if (b.waited && cudaEventQuery(b.waited) != cudaSuccess) break;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, b.start, b.done) == cudaSuccess) copy_busy_s_ += ms * 1e-3;
    CopyTiming t{.ticket = b.ticket, .blocks_out = b.blocks_out, .blocks_in = b.blocks_in};
    t.start_ms = DeviceClockMs(b.start);
    t.end_ms = DeviceClockMs(b.done);
    // A wait that began after the batch ended cost nothing (the elapsed time is then negative).
    if (b.waited && cudaEventElapsedTime(&ms, b.waited, b.done) == cudaSuccess) {
      copy_waited_s_ += std::max(0.f, ms) * 1e-3;
      t.waited_ms = std::max(0.f, ms);
    }
    if (timings_.size() == kMaxTimings) timings_.pop_front();
    timings_.push_back(t);
    for (cudaEvent_t e : {b.start, b.done, b.waited}) {
      if (e) spare_events_.push_back(e);
    }
    timing_.pop_front();
  }
  return completed_;
}

absl::Status KvPool::WaitForCopies(uint64_t ticket) {
  for (const Batch& b : batches_) {
    if (b.ticket < ticket) continue;
    INFERD_CUDA(cudaEventSynchronize(b.done));
    break;
  }
  CompletedCopies();
  return absl::OkStatus();
}

absl::StatusOr<bool> KvPool::OrderWrites(std::span<const int32_t> slots, int32_t block_size, cudaStream_t compute) {
  if (batches_.empty()) return false;
  uint64_t last = 0;
  for (int32_t slot : slots) last = std::max(last, block_ticket_[slot / block_size]);
  if (last <= CompletedCopies()) return false;
  for (Batch& b : batches_) {
    if (b.ticket < last) continue;
    if (!b.waited) {
      INFERD_ASSIGN_OR_RETURN(b.waited, TakeEvent());
      INFERD_CUDA(cudaEventRecord(b.waited, compute));
    }
    INFERD_CUDA(cudaStreamWaitEvent(compute, b.done, 0));
    return true;
  }
  return false;
}

}  // namespace inferd::cuda

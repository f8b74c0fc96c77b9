// Decode steps replay CUDA graphs captured at start-up, one per batch-size bucket (DeviceLayout::decode_buckets),
// for the smallest bucket that holds the step; the rows past the step's own are padding that reads and writes
// only the pool's reserved block. A bucket whose rows alone fill the GPU has a second graph whose attention gives
// each (sequence, KV head) its whole KV (kernels::DecodeKvUnsplit). Each graph keeps the attention plans it was
// captured with: a replay is valid only for a step planned with the same layout.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "engine/backends/cuda/forward.h"
#include "engine/runtime/backend.h"

namespace inferd::cuda {

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The bucket that replays this step: every row one new token that samples, the padded page table within
  // max_pages; 0 when none does (or nothing is captured).
  int32_t BucketFor(const StepInput& in, int64_t max_pages) const;
  // The step with padding rows up to `rows`, each one token at position 0 on `reserved_block`, greedy.
  static StepInput Pad(const StepInput& in, int32_t rows, int32_t reserved_block);
  // Whether this step replays its bucket's graph of unsplit KV attention (judged on the step's own rows).
  bool UseUnsplit(const StepInput& in, int32_t bucket, int64_t num_kv_heads) const;

  // Captures what `forward` enqueues on `stream` as the graph of (rows, unsplit): once eagerly first, so that
  // cuBLASLt picks its algorithms outside the capture. The step's inputs are on the device and planned (`plans`).
  absl::Status Capture(int32_t rows, bool unsplit, const AttentionPlans& plans,
                       const std::function<absl::Status()>& forward, cudaStream_t stream);
  // The graph of (bucket, unsplit) if it was captured with these attention plans, else null.
  cudaGraphExec_t Find(int32_t bucket, bool unsplit, const AttentionPlans& plans) const;

  void set_num_sms(int32_t n) { num_sms_ = n; }

 private:
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    AttentionPlans plans;
  };
  std::map<int32_t, Graph> split_;    // by padded batch size; attention splits KV
  std::map<int32_t, Graph> unsplit_;  // the buckets whose rows alone fill the GPU
  int32_t num_sms_ = 0;
};

}  // namespace inferd::cuda

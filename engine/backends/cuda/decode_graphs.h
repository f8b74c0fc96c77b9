// Decode steps replay CUDA graphs captured at start-up, one per bucket (DeviceLayout::graph_buckets: decode steps of
// 1, 2, 4, ... sequences, and speculative decoding's verify steps of 1 + k tokens a sequence), for the first bucket
// that holds the step; the sequences past the step's own are padding that reads and writes only the pool's
// reserved block (graph_buckets.h). A decode bucket whose rows alone fill the GPU has a second graph whose attention
// gives each (sequence, KV head) its whole KV (kernels::DecodeKvUnsplit). Each graph keeps the attention plans it was
// captured with: a replay is valid only for a step planned with the same layout.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "engine/backends/cuda/forward.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/graph_buckets.h"

namespace inferd::cuda {

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The captured bucket that replays this step (ChooseGraphBucket over the captured ones); empty when none does.
  GraphBucket BucketFor(const StepInput& in, int64_t max_pages) const;
  // Whether this step replays its decode bucket's graph of unsplit KV attention (judged on the step's own rows).
  bool UseUnsplit(const StepInput& in, GraphBucket bucket, int64_t num_kv_heads) const;

  // Captures what `forward` enqueues on `stream` as the graph of (bucket, unsplit): once eagerly first, so that
  // cuBLASLt picks its algorithms outside the capture. The step's inputs are on the device and planned (`plans`).
  absl::Status Capture(GraphBucket bucket, bool unsplit, const AttentionPlans& plans,
                       const std::function<absl::Status()>& forward, cudaStream_t stream);
  // The graph of (bucket, unsplit) if it was captured with these attention plans, else null.
  cudaGraphExec_t Find(GraphBucket bucket, bool unsplit, const AttentionPlans& plans) const;

  void set_num_sms(int32_t n) { num_sms_ = n; }

 private:
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    AttentionPlans plans;
  };
  std::vector<GraphBucket> buckets_;      // those captured, in ChooseGraphBucket's order
  std::map<GraphBucket, Graph> split_;    // attention splits KV
  std::map<GraphBucket, Graph> unsplit_;  // the decode buckets whose rows alone fill the GPU
  int32_t num_sms_ = 0;
};

}  // namespace inferd::cuda

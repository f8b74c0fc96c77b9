#include "engine/backends/cuda/decode_graphs.h"

#include <algorithm>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/status_macros.h"

namespace inferd::cuda {

DecodeGraphs::~DecodeGraphs() {
  for (auto* graphs : {&split_, &unsplit_})
    for (auto& [bucket, g] : *graphs) cudaGraphExecDestroy(g.exec);
}

GraphBucket DecodeGraphs::BucketFor(const StepInput& in, int64_t max_pages) const {
  return ChooseGraphBucket(in, buckets_, max_pages);
}

bool DecodeGraphs::UseUnsplit(const StepInput& in, GraphBucket bucket, int64_t num_kv_heads) const {
  if (!bucket.decode() || !unsplit_.contains(bucket)) return false;
  int64_t max_pages = 0;
  for (int32_t s = 0; s < in.num_seqs(); ++s)
    max_pages = std::max<int64_t>(max_pages, in.kv_indptr[s + 1] - in.kv_indptr[s]);
  return kernels::DecodeKvUnsplit(in.num_seqs(), num_kv_heads, num_sms_, max_pages, in.kv_indptr.back());
}

absl::Status DecodeGraphs::Capture(GraphBucket bucket, bool unsplit, const AttentionPlans& plans,
                                   const std::function<absl::Status()>& forward, cudaStream_t stream) {
  INFERD_RETURN_IF_ERROR(forward());
  Graph g;
  g.plans = plans;
  cudaGraph_t graph = nullptr;
  INFERD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = forward();
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  INFERD_RETURN_IF_ERROR(captured);
  INFERD_CUDA(ended);
  const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  INFERD_CUDA(made);
  (unsplit ? unsplit_ : split_)[bucket] = g;
  if (!unsplit) buckets_.insert(std::upper_bound(buckets_.begin(), buckets_.end(), bucket), bucket);
  return absl::OkStatus();
}

cudaGraphExec_t DecodeGraphs::Find(GraphBucket bucket, bool unsplit, const AttentionPlans& plans) const {
  const auto& graphs = unsplit ? unsplit_ : split_;
  auto it = graphs.find(bucket);
  if (it == graphs.end()) return nullptr;
  if (!(plans == it->second.plans)) return nullptr;
  return it->second.exec;
}

}  // namespace inferd::cuda

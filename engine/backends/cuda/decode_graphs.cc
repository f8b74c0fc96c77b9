#include "engine/backends/cuda/decode_graphs.h"

#include <algorithm>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/runtime/step_input.h"
#include "engine/status_macros.h"

namespace inferd::cuda {

DecodeGraphs::~DecodeGraphs() {
  for (auto* graphs : {&split_, &unsplit_})
    for (auto& [rows, g] : *graphs) cudaGraphExecDestroy(g.exec);
}

int32_t DecodeGraphs::BucketFor(const StepInput& in, int64_t max_pages) const {
  if (split_.empty() || in.num_seqs() == 0 || in.num_tokens() != in.num_seqs() || in.num_logits() != in.num_seqs()) {
    return 0;
  }
  auto it = split_.lower_bound(in.num_seqs());
  if (it == split_.end()) return 0;
  const int64_t padded_pages = int64_t{in.kv_indptr.back()} + (it->first - in.num_seqs());
  return padded_pages <= max_pages ? it->first : 0;  // padding takes one page per row
}

StepInput DecodeGraphs::Pad(const StepInput& in, int32_t rows, int32_t reserved_block) {
  StepInput p = in;
  const int32_t token = 0;
  for (int32_t r = in.num_seqs(); r < rows; ++r) {
    AddSequence(&p, {&token, 1}, 0, 1, {&reserved_block, 1}, /*sampled=*/true);
    SamplingRow& greedy = p.sampling.emplace_back();
    greedy.params.temperature = 0;
    greedy.position = 1;
  }
  return p;
}

bool DecodeGraphs::UseUnsplit(const StepInput& in, int32_t bucket, int64_t num_kv_heads) const {
  if (!unsplit_.contains(bucket)) return false;
  int64_t max_pages = 0;
  for (int32_t s = 0; s < in.num_seqs(); ++s)
    max_pages = std::max<int64_t>(max_pages, in.kv_indptr[s + 1] - in.kv_indptr[s]);
  return kernels::DecodeKvUnsplit(in.num_seqs(), num_kv_heads, num_sms_, max_pages, in.kv_indptr.back());
}

absl::Status DecodeGraphs::Capture(int32_t rows, bool unsplit, const AttentionPlans& plans,
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
  (unsplit ? unsplit_ : split_)[rows] = g;
  return absl::OkStatus();
}

cudaGraphExec_t DecodeGraphs::Find(int32_t bucket, bool unsplit, const AttentionPlans& plans) const {
  const auto& graphs = unsplit ? unsplit_ : split_;
  auto it = graphs.find(bucket);
  if (it == graphs.end()) return nullptr;
  if (!(plans == it->second.plans)) return nullptr;
  return it->second.exec;
}

}  // namespace inferd::cuda

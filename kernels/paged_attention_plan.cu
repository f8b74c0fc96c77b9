#include <flashinfer/attention/scheduler.cuh>
#include <vector>

#include "kernels/paged_attention.h"

namespace inferd::kernels {

cudaError_t PlanPagedAttention(void* float_workspace, void* int_workspace, void* int_workspace_pinned,
                               const int32_t* qo_indptr_host, const int32_t* kv_indptr_host, int32_t num_tokens,
                               int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                               int32_t page_size, bool decode_graph, bool unsplit_kv, AttentionPlan* plan,
                               cudaStream_t stream, int32_t window_left) {
  if (!AttentionHeadDimSupported(head_dim) || num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  try {
    flashinfer::PrefillPlanInfo info;
    const cudaError_t err = flashinfer::PrefillPlan<int32_t>(
        float_workspace, kAttentionFloatWorkspaceBytes, int_workspace, int_workspace_pinned,
        kAttentionIntWorkspaceBytes, info, const_cast<int32_t*>(qo_indptr_host), const_cast<int32_t*>(kv_indptr_host),
        num_tokens, num_seqs, num_qo_heads, num_kv_heads, head_dim, head_dim, page_size,
        /*enable_cuda_graph=*/decode_graph, /*sizeof_dtype_o=*/2, window_left, /*fixed_split_size=*/-1,
        /*disable_split_kv=*/decode_graph && unsplit_kv, /*num_colocated_ctas=*/0,
        /*uniform_q_len=*/decode_graph ? 1 : 0, stream);
    if (err != cudaSuccess) return err;
    const std::vector<int64_t> words = info.ToVector();
    for (size_t i = 0; i < words.size() && i < 15; ++i) plan->words[i] = words[i];
    return cudaSuccess;
  } catch (...) {
    return cudaErrorInvalidConfiguration;  // FlashInfer reports some planning failures by throwing
  }
}

}  // namespace inferd::kernels

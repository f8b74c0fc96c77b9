#include <flashinfer/attention/scheduler.cuh>
#include <vector>

#include "kernels/device_code.h"
#include "kernels/paged_attention.h"

namespace inferd::kernels {
namespace {

// The query rows of the Hopper kernel's tile (FlashInfer's prefill_sm90.cuh).
constexpr int64_t HopperTileRows(int32_t head_dim) {
  return head_dim == 64 ? 192 : 128;
}

// The Hopper kernel's schedule: a work item per (query tile, query head), balanced over the SMs by KV length.
cudaError_t PlanHopper(void* float_workspace, void* int_workspace, void* int_workspace_pinned,
                       const int32_t* qo_indptr_host, const int32_t* kv_indptr_host,
                       const int32_t* kv_last_page_len_host, int32_t num_tokens, int32_t num_seqs, int32_t num_qo_heads,
                       int32_t num_kv_heads, int32_t head_dim, int32_t page_size, AttentionPlan* plan,
                       cudaStream_t stream) {
  // Past 4096 tiles a head FlashInfer schedules every head alike, a variant not compiled here: FA2's plan instead.
  const int64_t tile = HopperTileRows(head_dim);
  if ((num_tokens + tile - 1) / tile + num_seqs - 1 > 4096) return cudaErrorNotSupported;
  std::vector<int32_t> kv_len(num_seqs);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t pages = kv_indptr_host[s + 1] - kv_indptr_host[s];
    kv_len[s] = pages > 0 ? (pages - 1) * page_size + kv_last_page_len_host[s] : 0;
  }
  flashinfer::PrefillPlanSM90Info info;
  const cudaError_t err = flashinfer::PrefillSM90Plan<int32_t>(
      float_workspace, kAttentionFloatWorkspaceBytes, int_workspace, int_workspace_pinned, kAttentionIntWorkspaceBytes,
      info, const_cast<int32_t*>(qo_indptr_host), const_cast<int32_t*>(kv_indptr_host), kv_len.data(), num_tokens,
      num_seqs, num_qo_heads, num_kv_heads, head_dim, head_dim, page_size,
      /*causal=*/true, /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, stream);
  if (err != cudaSuccess) return err;
  if (info.same_schedule_for_all_heads) return cudaErrorNotSupported;  // as above, should FlashInfer's rule change
  const std::vector<int64_t> words = info.ToVector();
  for (size_t i = 0; i < words.size(); ++i) plan->words[i] = words[i];
  plan->words[kHopperPlanRowsWord] = num_tokens;
  plan->kernel = AttentionKernel::kHopper;
  return cudaSuccess;
}

}  // namespace

bool HopperPrefillAvailable(int device) {
  return RunsSm90aCode(device);
}

bool HopperPrefillFits(const int32_t* qo_indptr_host, int32_t num_seqs, int32_t head_dim) {
  const int64_t tile = HopperTileRows(head_dim);
  int64_t rows = 0, tile_rows = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int64_t n = qo_indptr_host[s + 1] - qo_indptr_host[s];
    rows += n;
    tile_rows += (n + tile - 1) / tile * tile;
  }
  return rows > 0 && 4 * rows >= 3 * tile_rows;
}

cudaError_t PlanPagedAttention(void* float_workspace, void* int_workspace, void* int_workspace_pinned,
                               const int32_t* qo_indptr_host, const int32_t* kv_indptr_host, int32_t num_tokens,
                               int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                               int32_t page_size, bool decode_graph, bool unsplit_kv, AttentionPlan* plan,
                               cudaStream_t stream, int32_t window_left, bool hopper_prefill,
                               const int32_t* kv_last_page_len_host) {
  if (!AttentionHeadDimSupported(head_dim) || num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  *plan = AttentionPlan{};
  try {
    if (hopper_prefill && !decode_graph && window_left < 0 && kv_last_page_len_host != nullptr &&
        PlanHopper(float_workspace, int_workspace, int_workspace_pinned, qo_indptr_host, kv_indptr_host,
                   kv_last_page_len_host, num_tokens, num_seqs, num_qo_heads, num_kv_heads, head_dim, page_size, plan,
                   stream) == cudaSuccess) {
      return cudaSuccess;
    }
  } catch (...) {  // a schedule larger than the workspace: the Ampere kernel's plan instead
  }
  *plan = AttentionPlan{};
  try {
    flashinfer::PrefillPlanInfo info;
    const cudaError_t err = flashinfer::PrefillPlan<int32_t>(
        float_workspace, kAttentionFloatWorkspaceBytes, int_workspace, int_workspace_pinned,
        kAttentionIntWorkspaceBytes, info, const_cast<int32_t*>(qo_indptr_host), const_cast<int32_t*>(kv_indptr_host),
        num_tokens, num_seqs, num_qo_heads, num_kv_heads, head_dim, head_dim, page_size,
        /*enable_cuda_graph=*/decode_graph, /*sizeof_dtype_o=*/2, window_left, /*fixed_split_size=*/-1,
        /*disable_split_kv=*/decode_graph && unsplit_kv, /*num_colocated_ctas=*/0,
        /*uniform_q_len=*/decode_graph && num_tokens == num_seqs ? 1 : 0, stream);
    if (err != cudaSuccess) return err;
    const std::vector<int64_t> words = info.ToVector();
    for (size_t i = 0; i < words.size() && i < 15; ++i) plan->words[i] = words[i];
    plan->decode_unsplit = decode_graph && unsplit_kv && num_tokens == num_seqs;
    return cudaSuccess;
  } catch (...) {
    return cudaErrorInvalidConfiguration;  // FlashInfer reports some planning failures by throwing
  }
}

}  // namespace inferd::kernels

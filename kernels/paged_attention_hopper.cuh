// FlashInfer's Hopper batch-prefill kernel (FA3: Q by TMA, K/V gathered from the pages, wgmma, producer and consumer
// warp groups) over the paged KV pool, for one dtype (included by one .cu per dtype, so they compile in parallel).
// Causal, no window, no soft cap, a cache of T: the runs PlanPagedAttention gives a Hopper plan.
#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/cutlass_utils.cuh>
#include <vector>

#include "kernels/paged_attention.h"

namespace inferd::kernels {
namespace {

template <typename T, uint32_t HEAD_DIM>
cudaError_t RunHopper(const AttentionPlan& plan, void* int_workspace, const T* q, int64_t q_row_stride,
                      const T* k_cache, const T* v_cache, const int32_t* kv_indices, T* out, int32_t num_rows,
                      int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size, float sm_scale,
                      cudaStream_t stream) {
  using C = typename flashinfer::cutlass_dtype<T>::type;
  using Params = flashinfer::BatchPrefillPagedParams<C, C, C, int32_t>;
  flashinfer::PrefillPlanSM90Info info;
  info.FromVector(std::vector<int64_t>(plan.words, plan.words + 9));
  const auto at = [int_workspace](int64_t offset) {
    return reinterpret_cast<int32_t*>(static_cast<char*>(int_workspace) + offset);
  };
  Params p{};
  p.q_ptr = reinterpret_cast<C*>(const_cast<T*>(q));
  p.k_ptr = reinterpret_cast<C*>(const_cast<T*>(k_cache));
  p.v_ptr = reinterpret_cast<C*>(const_cast<T*>(v_cache));
  p.o_ptr = reinterpret_cast<C*>(out);
  p.lse_ptr = nullptr;
  p.qo_tile_indices = at(info.qo_tile_indices_offset);
  p.qo_indptr = at(info.qo_indptr_offset);
  p.kv_indptr = at(info.kv_indptr_offset);
  p.kv_indices = const_cast<int32_t*>(kv_indices);
  p.qo_lens = at(info.qo_len_offset);
  p.kv_lens = at(info.kv_len_offset);
  p.head_indices = at(info.head_indices_offset);
  p.work_indptr = at(info.work_indptr_offset);
  p.batch_indices = at(info.batch_indices_offset);
  p.additional_params.logits_soft_cap = 0.f;
  p.additional_params.sm_scale = sm_scale;
  p.additional_params.maybe_prefix_len_ptr = nullptr;
  p.additional_params.maybe_token_pos_in_items_ptr = nullptr;
  p.additional_params.token_pos_in_items_len = 0;
  p.additional_params.maybe_max_item_len_ptr = nullptr;
  // The pool's layout (kernels/paged_attention.h): per page [page_size, num_kv_heads, HEAD_DIM]; q rows inside the
  // fused q/k/v rows; out rows of num_qo_heads × HEAD_DIM.
  p.q_stride_n = q_row_stride;
  p.q_stride_h = HEAD_DIM;
  p.k_stride_n = p.v_stride_n = int64_t{num_kv_heads} * HEAD_DIM;
  p.k_stride_h = p.v_stride_h = HEAD_DIM;
  p.o_stride_n = int64_t{num_qo_heads} * HEAD_DIM;
  p.o_stride_h = HEAD_DIM;
  p.k_page_stride = p.v_page_stride = int64_t{page_size} * num_kv_heads * HEAD_DIM;
  p.nnz_qo = num_rows;
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = num_kv_heads;
  p.group_size = num_qo_heads / num_kv_heads;
  p.page_size = page_size;
  p.window_left = -1;
  p.causal = true;
  // Planned without one schedule for all heads (PlanPagedAttention refuses schedules that would need it).
  if (info.same_schedule_for_all_heads) return cudaErrorInvalidValue;
  return flashinfer::BatchPrefillWithPagedKVCacheDispatched<HEAD_DIM, HEAD_DIM, flashinfer::MaskMode::kCausal,
                                                            /*LEFT_SLIDING_WINDOW=*/false,
                                                            /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false,
                                                            flashinfer::StandardAttention, Params>(
      p, /*enable_pdl=*/false, stream);
}

}  // namespace

#define INFERD_HOPPER_PREFILL(T)                                                                                      \
  INFERD_DECLARE_HOPPER_PREFILL(T) {                                                                                  \
    try {                                                                                                             \
      switch (head_dim) {                                                                                             \
        case 64:                                                                                                      \
          return RunHopper<T, 64>(plan, int_workspace, q, q_row_stride, k_cache, v_cache, kv_indices, out, num_rows,  \
                                  num_qo_heads, num_kv_heads, page_size, sm_scale, stream);                           \
        case 128:                                                                                                     \
          return RunHopper<T, 128>(plan, int_workspace, q, q_row_stride, k_cache, v_cache, kv_indices, out, num_rows, \
                                   num_qo_heads, num_kv_heads, page_size, sm_scale, stream);                          \
        case 256:                                                                                                     \
          return RunHopper<T, 256>(plan, int_workspace, q, q_row_stride, k_cache, v_cache, kv_indices, out, num_rows, \
                                   num_qo_heads, num_kv_heads, page_size, sm_scale, stream);                          \
        default:                                                                                                      \
          return cudaErrorInvalidValue;                                                                               \
      }                                                                                                               \
    } catch (...) {                                                                                                   \
      return cudaErrorLaunchFailure; /* nothing thrown by FlashInfer escapes */                                       \
    }                                                                                                                 \
  }

}  // namespace inferd::kernels

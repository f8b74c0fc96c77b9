// Instantiation of FlashInfer's paged batch-prefill kernel for one (query, cache) dtype pair (included by one .cu
// per pair, so they compile in parallel).
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <type_traits>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/paged_attention.h"

namespace inferd::kernels {
namespace {

using flashinfer::MaskMode;
using flashinfer::PosEncodingMode;

template <typename Params>
Params MakeParams(const flashinfer::PrefillPlanInfo& info, void* float_ws, void* int_ws, typename Params::DTypeQ* q,
                  int64_t q_row_stride, typename Params::DTypeKV* k, typename Params::DTypeKV* v, int32_t* qo_indptr,
                  int32_t* kv_indptr, int32_t* kv_indices, int32_t* kv_last_page_len, typename Params::DTypeO* out,
                  int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_size,
                  float sm_scale, typename Params::DTypeO** tmp_v, float** tmp_s) {
  Params p;
  p.q = q;
  p.paged_kv = flashinfer::paged_kv_t<typename Params::DTypeKV, int32_t>(num_kv_heads, page_size, head_dim, num_seqs,
                                                                         flashinfer::QKVLayout::kNHD, k, v, kv_indices,
                                                                         kv_indptr, kv_last_page_len);
  p.q_indptr = qo_indptr;
  p.o = out;
  p.lse = nullptr;
  p.num_qo_heads = num_qo_heads;
  p.group_size = flashinfer::uint_fastdiv(num_qo_heads / num_kv_heads);
  p.q_stride_n = static_cast<int32_t>(q_row_stride);
  p.q_stride_h = head_dim;
  p.window_left = -1;
  p.logits_soft_cap = 0.f;
  p.sm_scale = sm_scale;
  p.rope_rcp_scale = 1.f;
  p.rope_rcp_theta = 1.f;
  auto at = [](void* base, int64_t off) { return reinterpret_cast<char*>(base) + off; };
  p.request_indices = reinterpret_cast<int32_t*>(at(int_ws, info.request_indices_offset));
  p.qo_tile_indices = reinterpret_cast<int32_t*>(at(int_ws, info.qo_tile_indices_offset));
  p.kv_tile_indices = reinterpret_cast<int32_t*>(at(int_ws, info.kv_tile_indices_offset));
  p.o_indptr = reinterpret_cast<int32_t*>(at(int_ws, info.o_indptr_offset));
  p.kv_chunk_size_ptr = reinterpret_cast<int32_t*>(at(int_ws, info.kv_chunk_size_ptr_offset));
  *tmp_v = nullptr;
  *tmp_s = nullptr;
  if (info.split_kv) {
    p.merge_indptr = reinterpret_cast<int32_t*>(at(int_ws, info.merge_indptr_offset));
    *tmp_v = reinterpret_cast<typename Params::DTypeO*>(at(float_ws, info.v_offset));
    *tmp_s = reinterpret_cast<float*>(at(float_ws, info.s_offset));
  }
  p.padded_batch_size = info.padded_batch_size;
  p.max_total_num_rows = info.total_num_rows;
  p.partition_kv = info.split_kv;
  if (info.enable_cuda_graph) {  // padding CTAs are masked off; the row count is read on the device
    p.block_valid_mask = reinterpret_cast<bool*>(at(int_ws, info.block_valid_mask_offset));
    p.total_num_rows = reinterpret_cast<uint32_t*>(at(int_ws, info.total_num_rows_offset));
  }
  return p;
}

// FlashInfer's paged parameters with the factor its default output transform multiplies each row's output by
// (found by member name): the cache's V scale.
template <typename T, typename C>
struct ScaledVParams : flashinfer::BatchPrefillPagedParams<T, C, T, int32_t> {
  float v_scale = 1.f;
};

template <typename T, typename C, uint32_t HEAD_DIM, bool kWindow, bool kSoftCap>
cudaError_t Dispatch(const flashinfer::PrefillPlanInfo& info, void* float_ws, void* int_ws, const T* q,
                     int64_t q_row_stride, const C* k, const C* v, const int32_t* qo_indptr, const int32_t* kv_indptr,
                     const int32_t* kv_indices, const int32_t* kv_last_page_len, T* out, int32_t num_seqs,
                     int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size, float sm_scale, float v_scale,
                     bool early_launch, int32_t window_left, float soft_cap, cudaStream_t stream) {
  using Params = ScaledVParams<T, C>;
  using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/kWindow,
                                               /*soft_cap=*/kSoftCap, /*alibi=*/false>;
  T* tmp_v = nullptr;
  float* tmp_s = nullptr;
  Params p = MakeParams<Params>(info, float_ws, int_ws, const_cast<T*>(q), q_row_stride, const_cast<C*>(k),
                                const_cast<C*>(v), const_cast<int32_t*>(qo_indptr), const_cast<int32_t*>(kv_indptr),
                                const_cast<int32_t*>(kv_indices), const_cast<int32_t*>(kv_last_page_len), out, num_seqs,
                                num_qo_heads, num_kv_heads, HEAD_DIM, page_size, sm_scale, &tmp_v, &tmp_s);
  p.v_scale = v_scale;
  p.window_left = kWindow ? window_left : -1;
  p.logits_soft_cap = kSoftCap ? soft_cap : 0.f;
  switch (info.cta_tile_q) {
#define INFERD_CTA_TILE(TILE)                                                                                     \
  case TILE:                                                                                                      \
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched</*SAME_KV_STRIDES=*/true, TILE, HEAD_DIM, HEAD_DIM, \
                                                              PosEncodingMode::kNone, false, MaskMode::kCausal,   \
                                                              Variant, Params>(                                   \
        p, tmp_v, tmp_s, early_launch && DependentLaunchAllowed(), stream);
    INFERD_CTA_TILE(16)
    INFERD_CTA_TILE(64)
    INFERD_CTA_TILE(128)
#undef INFERD_CTA_TILE
    default:
      return cudaErrorInvalidConfiguration;
  }
}

// One variant family (soft-capped scores or not) over every compiled head dim.
template <typename T, typename C, bool kSoftCap>
cudaError_t RunVariant(const AttentionPlan& plan, void* float_workspace, void* int_workspace, const T* q,
                       int64_t q_row_stride, const C* k_cache, const C* v_cache, const int32_t* qo_indptr,
                       const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last_page_len, T* out,
                       int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                       int32_t page_size, float sm_scale, float v_scale, bool early_launch, cudaStream_t stream,
                       int32_t window_left, float soft_cap) {
  try {
    flashinfer::PrefillPlanInfo info;
    info.FromVector(std::vector<int64_t>(plan.words, plan.words + 15));
    switch (head_dim) {
#define INFERD_HEAD_DIM(D)                                                                                             \
  case D:                                                                                                              \
    if constexpr (sizeof(C) == 1 && D == 64) {                                                                         \
      return cudaErrorInvalidValue;                                                                                    \
    } else if constexpr (sizeof(C) == 1) { /* no sliding windows over an fp8 cache */                                  \
      if (window_left >= 0) return cudaErrorInvalidValue;                                                              \
      return Dispatch<T, C, D, false, kSoftCap>(info, float_workspace, int_workspace, q, q_row_stride, k_cache,        \
                                                v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, out,      \
                                                num_seqs, num_qo_heads, num_kv_heads, page_size, sm_scale, v_scale,    \
                                                early_launch, -1, soft_cap, stream);                                   \
    } else {                                                                                                           \
      return window_left >= 0                                                                                          \
                 ? Dispatch<T, C, D, true, kSoftCap>(info, float_workspace, int_workspace, q, q_row_stride, k_cache,   \
                                                     v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, out, \
                                                     num_seqs, num_qo_heads, num_kv_heads, page_size, sm_scale,        \
                                                     v_scale, early_launch, window_left, soft_cap, stream)             \
                 : Dispatch<T, C, D, false, kSoftCap>(info, float_workspace, int_workspace, q, q_row_stride, k_cache,  \
                                                      v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,     \
                                                      out, num_seqs, num_qo_heads, num_kv_heads, page_size, sm_scale,  \
                                                      v_scale, early_launch, -1, soft_cap, stream);                    \
    }
      INFERD_HEAD_DIM(64)
      INFERD_HEAD_DIM(128)
      INFERD_HEAD_DIM(256)
#undef INFERD_HEAD_DIM
      default:
        return cudaErrorInvalidValue;
    }
  } catch (...) {
    return cudaErrorLaunchFailure;  // nothing thrown by FlashInfer escapes
  }
}

}  // namespace

// Soft-capped scores over a cache of T: translation units of their own (paged_attention_softcap_*.cu), since they
// double the attention kernels compiled.
#define INFERD_SOFT_CAPPED(T)                                                                                      \
  cudaError_t RunPagedAttentionSoftCapped(                                                                         \
      const AttentionPlan& plan, void* float_workspace, void* int_workspace, const T* q, int64_t q_row_stride,     \
      const T* k_cache, const T* v_cache, const int32_t* qo_indptr, const int32_t* kv_indptr,                      \
      const int32_t* kv_indices, const int32_t* kv_last_page_len, T* out, int32_t num_seqs, int32_t num_qo_heads,  \
      int32_t num_kv_heads, int32_t head_dim, int32_t page_size, float sm_scale, float v_scale, bool early_launch, \
      cudaStream_t stream, int32_t window_left, float soft_cap)
INFERD_SOFT_CAPPED(__nv_bfloat16);
INFERD_SOFT_CAPPED(__half);

template <typename T, typename C>
cudaError_t RunPagedAttention(const AttentionPlan& plan, void* float_workspace, void* int_workspace, const T* q,
                              int64_t q_row_stride, const C* k_cache, const C* v_cache, const int32_t* qo_indptr,
                              const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last_page_len,
                              T* out, int32_t num_seqs, int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                              int32_t page_size, float sm_scale, float v_scale, bool early_launch, cudaStream_t stream,
                              int32_t window_left, float logits_soft_cap) {
  if (plan.kernel == AttentionKernel::kHopper) {  // planned for a cache of T, without window or soft cap
    if constexpr (std::is_same_v<T, C>) {
      if (logits_soft_cap > 0.f || window_left >= 0 || v_scale != 1.f) return cudaErrorInvalidValue;
      return RunHopperPrefill(plan, int_workspace, q, q_row_stride, k_cache, v_cache, kv_indices, out,
                              static_cast<int32_t>(plan.words[kHopperPlanRowsWord]), num_qo_heads, num_kv_heads,
                              head_dim, page_size, sm_scale, stream);
    }
    return cudaErrorInvalidValue;
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<C, __nv_fp8_e4m3>) {
    if (plan.decode_unsplit && window_left < 0 && logits_soft_cap == 0.f &&
        DecodeAttentionFp8Supports(num_qo_heads, num_kv_heads, head_dim)) {
      return RunDecodeAttentionFp8(q, q_row_stride, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out,
                                   num_seqs, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale, v_scale,
                                   early_launch, stream);
    }
  }
  if (logits_soft_cap > 0.f) {
    if constexpr (std::is_same_v<T, C>) {
      return RunPagedAttentionSoftCapped(plan, float_workspace, int_workspace, q, q_row_stride, k_cache, v_cache,
                                         qo_indptr, kv_indptr, kv_indices, kv_last_page_len, out, num_seqs,
                                         num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale, v_scale,
                                         early_launch, stream, window_left, logits_soft_cap);
    }
    return cudaErrorInvalidValue;  // no soft caps over an fp8 cache
  }
  return RunVariant<T, C, false>(plan, float_workspace, int_workspace, q, q_row_stride, k_cache, v_cache, qo_indptr,
                                 kv_indptr, kv_indices, kv_last_page_len, out, num_seqs, num_qo_heads, num_kv_heads,
                                 head_dim, page_size, sm_scale, v_scale, early_launch, stream, window_left, 0.f);
}

}  // namespace inferd::kernels

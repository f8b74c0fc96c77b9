// FlashInfer's attention with soft-capped scores (Gemma 2's attn_logit_softcapping) over a bf16 cache.
#include "kernels/paged_attention_run.cuh"

namespace inferd::kernels {

INFERD_SOFT_CAPPED(__nv_bfloat16) {
  return RunVariant<__nv_bfloat16, __nv_bfloat16, true>(plan, float_workspace, int_workspace, q, q_row_stride, k_cache,
                                                        v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                                        out, num_seqs, num_qo_heads, num_kv_heads, head_dim, page_size,
                                                        sm_scale, v_scale, early_launch, stream, window_left, soft_cap);
}

}  // namespace inferd::kernels

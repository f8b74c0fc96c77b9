#include "kernels/paged_attention_run.cuh"

namespace inferd::kernels {
template cudaError_t RunPagedAttention<__nv_bfloat16, __nv_bfloat16>(
    const AttentionPlan&, void*, void*, const __nv_bfloat16*, int64_t, const __nv_bfloat16*, const __nv_bfloat16*,
    const int32_t*, const int32_t*, const int32_t*, const int32_t*, __nv_bfloat16*, int32_t, int32_t, int32_t, int32_t,
    int32_t, float, float, bool, cudaStream_t, int32_t, float);
}  // namespace inferd::kernels

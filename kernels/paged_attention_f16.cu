#include "kernels/paged_attention_run.cuh"

namespace inferd::kernels {
template cudaError_t RunPagedAttention<__half, __half>(const AttentionPlan&, void*, void*, const __half*, int64_t,
                                                       const __half*, const __half*, const int32_t*, const int32_t*,
                                                       const int32_t*, const int32_t*, __half*, int32_t, int32_t,
                                                       int32_t, int32_t, int32_t, float, float, bool, cudaStream_t,
                                                       int32_t, float);
}  // namespace inferd::kernels

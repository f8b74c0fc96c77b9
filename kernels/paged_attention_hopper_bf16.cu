#include "kernels/paged_attention_hopper.cuh"

namespace inferd::kernels {
INFERD_HOPPER_PREFILL(__nv_bfloat16)
}  // namespace inferd::kernels

#include "kernels/paged_attention_hopper.cuh"

namespace inferd::kernels {
INFERD_HOPPER_PREFILL(__half)
}  // namespace inferd::kernels

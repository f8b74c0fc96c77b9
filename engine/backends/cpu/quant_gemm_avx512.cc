// InterleavedGemm's kernels for AVX-512 VNNI (compiled with -mavx512vnni -mavx512vl: CMakeLists.txt).
#define QUANT_GEMM_VNNI 1
#include "engine/backends/cpu/quant_gemm_kernel.h"

namespace inferd {

void InterleavedGroupsAvx512Vnni(uint32_t ggml_type, const uint8_t* records, int64_t g0, int64_t g1,
                                 const QuantizedView& x, float* y, int64_t ldy) {
  if (ggml_type == GGML_TYPE_Q4_1) return Groups<GGML_TYPE_Q4_1>(records, g0, g1, x, y, ldy);
  if (ggml_type == GGML_TYPE_Q5_0) return Groups<GGML_TYPE_Q5_0>(records, g0, g1, x, y, ldy);
  if (ggml_type == GGML_TYPE_Q4_K) return Groups<GGML_TYPE_Q4_K>(records, g0, g1, x, y, ldy);
  return Groups<GGML_TYPE_Q8_0>(records, g0, g1, x, y, ldy);
}

}  // namespace inferd

// QuantGemm's kernels for AVX2 (this file is compiled with -mavx2 -mfma -mf16c: CMakeLists.txt).
#define QUANT_GEMM_VNNI 0
#include "engine/backends/cpu/quant_gemm_kernel.h"

namespace inferd {

void QuantGemmRowsAvx2(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, const QuantizedView& x, float* y,
                       int64_t ldy, float* scratch) {
  if (ggml_type == GGML_TYPE_Q4_1) return Rows<GGML_TYPE_Q4_1>(rows, count, x, y, ldy, scratch);
  if (ggml_type == GGML_TYPE_Q5_0) return Rows<GGML_TYPE_Q5_0>(rows, count, x, y, ldy, scratch);
  return Rows<GGML_TYPE_Q8_0>(rows, count, x, y, ldy, scratch);
}

}  // namespace inferd

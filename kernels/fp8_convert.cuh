// Rounding to e4m3 with a per-row scale, shared by the kernels that quantize activations (device code only; the
// format: kernels/fp8.h).
#pragma once

#include <cuda_fp8.h>

#include "kernels/fp8.h"

namespace inferd::kernels {

// A row's scale from its largest magnitude: 1 for a row of zeros.
__device__ __forceinline__ float ScaleFor(float amax) {
  return amax > 0.f ? amax / kFp8Max : 1.f;
}

__device__ __forceinline__ Fp8 Quantize(float v, float scale) {
  Fp8 q;
  q.__x = __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
  return q;
}

}  // namespace inferd::kernels

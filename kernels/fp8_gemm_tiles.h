// The tile choices of kernels/fp8_gemm.h, one function each (kernels/fp8_gemm_kernel.cuh), for fp8_gemm.cu to
// dispatch to. Shapes are checked by the caller (Fp8ScaledGemmSupports).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/fp8.h"

namespace inferd::kernels::fp8_gemm {

struct Args {
  const Fp8* x;
  const float* x_scale;
  const Fp8* w;
  const float* w_scale;
  const __nv_bfloat16* bias;
  __nv_bfloat16* y;
  int m, n, k;
  cudaStream_t stream;
};

cudaError_t Run64x64(const Args& a);    // fp8_gemm_rows64.cu
cudaError_t Run64x128(const Args& a);   // fp8_gemm_rows64.cu
cudaError_t Run128x64(const Args& a);   // fp8_gemm_rows128.cu
cudaError_t Run128x128(const Args& a);  // fp8_gemm_rows128.cu
cudaError_t Run128x256(const Args& a);  // fp8_gemm_rows128.cu

}  // namespace inferd::kernels::fp8_gemm

// RMSNorm over rows: out[r, :] = weight ⊙ x[r, :] / sqrt(mean(x[r, :]²) + eps), fp32 accumulation.
// Raw pointers + sizes + stream in, cudaError_t out; no engine types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// x, out: [rows, n] bf16 row-major; weight: [n] bf16.
cudaError_t RmsNormBf16(const __nv_bfloat16* x, const __nv_bfloat16* weight, __nv_bfloat16* out, int64_t rows,
                        int64_t n, float eps, cudaStream_t stream);
// The same in fp32, for the reference path and tests.
cudaError_t RmsNormF32(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps,
                       cudaStream_t stream);

}  // namespace inferd::kernels

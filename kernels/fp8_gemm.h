// FP8 products of many rows (prefill, large decode batches) on Hopper in one CUTLASS kernel: e4m3 rows with a scale
// per row (per token) against e4m3 weights with a scale per output channel, both scales and the bias applied in the
// epilogue (an epilogue visitor tree), from the CUTLASS headers the FlashInfer wheel ships. Where cuBLASLt applies
// the two scale vectors as "outer vectors" at a measured 0.7–1.2 ms a decode step (kernels/NOTES.md), this reads
// them beside the accumulators in registers.
//   y[r, c] = round_T(x_scale[r] · (w_scale[c] · Σ_i q_x[r, i] · q_w[c, i]) + bias[c]), accumulated in the tensor
//   cores' fp8 accumulators (CUTLASS's "fast accumulation", as vLLM's and TensorRT-LLM's fp8 GEMMs run).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8.h"

namespace inferd::kernels {

// True where `device` runs it: compute capability 9.0 and this build carrying sm_90a code.
bool Fp8ScaledGemmAvailable(int device);
// True where the shape suits its TMA loads: k a multiple of 16, n of 8, x, w, y and bias 16-byte aligned.
bool Fp8ScaledGemmSupports(const void* x, const void* w, const void* y, const void* bias, int64_t n, int64_t k);

// x: [m, k] e4m3 with x_scale [m]; w: [n, k] e4m3 with w_scale [n]; bias [n] or null; y: [m, n] in bf16. The tile
// shape by the rows: 64 × 128 (pairs of CTAs along n sharing the rows' tile) up to 128 rows, else 128 × 128 (pairs
// along m). cudaErrorNotSupported where Fp8ScaledGemmAvailable or Fp8ScaledGemmSupports is false.
cudaError_t Fp8ScaledGemm(const Fp8* x, const float* x_scale, const Fp8* w, const float* w_scale,
                          const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t m, int64_t n, int64_t k,
                          cudaStream_t stream);

}  // namespace inferd::kernels

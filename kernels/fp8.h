// FP8 (e4m3) kernels for `engine.quantization: fp8`. Weights are e4m3 with one fp32 scale per output row
// (per channel); activations that feed a cuBLASLt product are e4m3 with one fp32 scale per token, quantized by the
// kernel that produces them (the norm, SiLU·mul) or by QuantizeRowsFp8 (attention's output). A value is q · scale;
// scale = max|row| / 448 (1 for a row of zeros), q = the row / scale rounded to nearest e4m3, saturating.
// Products of a few rows (decode) stream the e4m3 weights against the activations in T (W8A16): they are bound
// by the weight bytes alone, and unquantized activations cost nothing there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/elementwise.h"  // GatedActivation
#include "kernels/gemv.h"         // GemvForm

namespace inferd::kernels {

using Fp8 = __nv_fp8_e4m3;
inline constexpr float kFp8Max = 448.f;

// q[r, :] and scales[r] for each row of src: [rows, cols]. Weights at load; activations that no fused kernel
// produces. Any cols ≥ 1.
template <typename T>
cudaError_t QuantizeRowsFp8(const T* src, int64_t rows, int64_t cols, Fp8* q, float* scales, cudaStream_t stream);

// True when AddRmsNormFp8 runs this shape: n a multiple of 8, at most 16384, pointers 16-byte aligned.
bool AddRmsNormFp8Supports(const void* residual, const void* delta, const void* weight, int64_t n);

// AddRmsNorm (kernels/elementwise.h) whose output, rounded to T as there, is quantized per row into q and scales
// instead of being stored in T. residual, delta: [rows, n] (delta may be null); q: [rows, n]; scales: [rows].
template <typename T>
cudaError_t AddRmsNormFp8(T* residual, const T* delta, const T* weight, Fp8* q, float* scales, int64_t rows, int64_t n,
                          float eps, cudaStream_t stream);

// ActivateMul (kernels/elementwise.h) whose output, rounded to T as there, is quantized per row. gate_up: [rows,
// 2 * inter]; q: [rows, inter]; scales: [rows].
template <typename T>
cudaError_t ActivateMulFp8(const T* gate_up, Fp8* q, float* scales, int64_t rows, int64_t inter, GatedActivation act,
                           cudaStream_t stream);

// True when GemvFp8 runs this shape: 1 ≤ m ≤ kGemvMaxRows (kernels/gemv.h), k a multiple of 16, x and w 16-byte
// aligned.
bool GemvFp8Supports(const void* x, const void* w, int64_t m, int64_t k);

// GemvForm::kAuto runs e4m3 weights on tensor cores from this many rows (kernels/gemv_tiles.cuh: each weight pair
// converted once, to f16, where the CUDA-core loop converts and multiplies it once per row of X). On the 8B model's
// fp8 decode chain (H200): CUDA cores 2.31 / 2.79 / 3.01 / 3.68 / 6.88 ms at 1 / 2 / 3 / 4 / 8 rows, tiles 2.84–2.88.
inline constexpr int kGemvFp8TensorCoreRows = 3;

// y[m, n] = (x[m, k] · q[n, k]ᵀ) ⊙ w_scale[n] (+ bias[n]), fp32 accumulation, rounded once to Out (T or fp32). On
// tensor cores a bf16 x runs as f16 scaled by 1/16: exact for magnitudes 2^-13 to 2^20, smaller ones rounded to
// multiples of 2^-20, larger ones saturated (kernels/gemv_tiles.cuh).
template <typename T, typename Out>
cudaError_t GemvFp8(const T* x, const Fp8* w, const float* w_scale, const T* bias, Out* y, int64_t m, int64_t n,
                    int64_t k, cudaStream_t stream, GemvForm form = GemvForm::kAuto);

}  // namespace inferd::kernels

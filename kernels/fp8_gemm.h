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

// The output tile a CTA computes (rows × columns, k-blocks of 128) and how CTAs pair up in clusters, multicasting
// the operand they share: which is fastest depends on the shape (kernels/NOTES.md), so the backend measures them
// at start-up for the shapes it will run (cuda::Gemm::Tune).
enum class Fp8GemmTile {
  kAuto,     // Fp8GemmTileFor(m)
  k64x64,    // 64 × 64, clusters of 8 along n, ping-pong
  k64x128,   // 64 × 128, pairs along n, ping-pong
  k128x64,   // 128 × 64, clusters of 8 along n, ping-pong
  k128x128,  // 128 × 128, pairs along m, ping-pong
  k128x256,  // 128 × 256, pairs along m, cooperative
};
inline constexpr Fp8GemmTile kFp8GemmTiles[] = {Fp8GemmTile::k64x64, Fp8GemmTile::k64x128, Fp8GemmTile::k128x64,
                                                Fp8GemmTile::k128x128, Fp8GemmTile::k128x256};
const char* Fp8GemmTileName(Fp8GemmTile tile);  // "64x128"; kAuto: "auto"
// The choice for a shape nothing measured: by the rows alone.
Fp8GemmTile Fp8GemmTileFor(int64_t m);

// x: [m, k] e4m3 with x_scale [m]; w: [n, k] e4m3 with w_scale [n]; bias [n] or null; y: [m, n] in bf16.
// cudaErrorNotSupported where Fp8ScaledGemmAvailable or Fp8ScaledGemmSupports is false.
cudaError_t Fp8ScaledGemm(const Fp8* x, const float* x_scale, const Fp8* w, const float* w_scale,
                          const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t m, int64_t n, int64_t k,
                          cudaStream_t stream, Fp8GemmTile tile = Fp8GemmTile::kAuto);

}  // namespace inferd::kernels

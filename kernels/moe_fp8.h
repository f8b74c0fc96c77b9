// The steps around the experts' fp8 grouped products (`engine.quantization: fp8`, steps whose runs go through
// MoeGroupedGemmFp8: kernels/moe_grouped_gemm.h). Weights are e4m3 with a scale per output row of each expert, as
// the dense products' (kernels/fp8.h); a product's input rows are e4m3 with a scale per row, and its output holds
// the unscaled sums (rounded to bf16: their range holds any sum of e4m3 products), which the step after it scales:
// sum · row scale · weight row's scale, rounded to T as a product's output is.
//   MoeGatherFp8: each slot of the grouped order gets its row (x[sorted_slots[i] / k]) quantized: q [slots, n],
//     scales [slots].
//   MoeActivateMulFp8: per slot i of expert e = topk_ids[sorted_slots[i]]: gate_j and up_j from the sums
//     gate_up [slots, 2 · inter] scaled by x_scales[i] and w_scale[e, j] (gate) or w_scale[e, inter + j]
//     (up), each rounded to T; then act(gate) · up as ActivateMul rounds it; the row quantized into q [slots,
//     inter] and scales [slots].
//   MoeCombineFp8: out[r] = Σ_j topk_weights[r, j] · (y[p] · act_scales[p] · w_scale[e_j] rounded to T), p =
//     slot_positions[r · k + j], e_j = topk_ids[r · k + j], in k order (fp32, rounded once): MoeCombine's sum.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/elementwise.h"
#include "kernels/fp8.h"

namespace inferd::kernels {

// x: [rows, n] in T, n a multiple of 8, x 16-byte aligned, q 8-byte aligned.
template <typename T>
cudaError_t MoeGatherFp8(const T* x, const int32_t* sorted_slots, int64_t slots, int32_t k, int64_t n, Fp8* q,
                         float* scales, cudaStream_t stream);

template <typename T>
cudaError_t MoeActivateMulFp8(const __nv_bfloat16* gate_up, const float* x_scales, const float* w_scale,
                              const int32_t* topk_ids, const int32_t* sorted_slots, int64_t slots, int64_t inter,
                              GatedActivation act, Fp8* q, float* scales, cudaStream_t stream);

template <typename T>
cudaError_t MoeCombineFp8(const __nv_bfloat16* y, const float* act_scales, const float* w_scale,
                          const int32_t* topk_ids, const int32_t* slot_positions, const float* topk_weights,
                          int64_t rows, int32_t k, int64_t n, T* out, cudaStream_t stream);

}  // namespace inferd::kernels

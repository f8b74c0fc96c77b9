// A mixture of experts' routing on the device (engine/model/architecture.h, LayerOp::kMoe), so that a step's
// experts are chosen and its rows grouped by expert without a trip to the host (decode steps stay in CUDA graphs):
//   1. per row of router logits: softmax over the experts in fp32, the top k (the larger weight first, the lower
//      expert among equals, as the cpu reference), their weights divided by their sum where `normalize`;
//   2. the rows' (row, k) slots grouped by expert: how many each expert got and where its run starts, and for each
//      place of the grouped order the slot it holds, row * k + j, for the gather before the experts' products and
//      the weighted sum after them.
// The order of slots within an expert's run is the order their rows' blocks reached it: the products are per row,
// and the sum back into a row takes its k slots in order j, so the outputs do not depend on it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// The largest expert count and top k MoeRoute takes (Qwen3-MoE's 128 and 8; DeepSeek's 256).
constexpr int32_t kMoeMaxExperts = 512;
constexpr int32_t kMoeMaxTopK = 16;

// logits [rows, experts] fp32 in; topk_ids, topk_weights [rows, k]; expert_offsets [experts + 1] (offsets[e] to
// offsets[e + 1] is expert e's run; the last is rows * k); sorted_slots [rows * k]. `counts` is scratch of
// `experts` ints, zero before the first call (each call leaves them zero). rows >= 1, 1 <= k <= experts <=
// kMoeMaxExperts, k <= kMoeMaxTopK.
// slot_positions [rows * k] (may be null): where each slot landed in the grouped order (the inverse of
// sorted_slots), for MoeCombine. experts_touched (may be null): one int, to which the call adds how many experts
// got rows (what the step reads of this layer's experts; the live efficiency metrics count it).
cudaError_t MoeRoute(const float* logits, int64_t rows, int32_t experts, int32_t k, bool normalize, int32_t* topk_ids,
                     float* topk_weights, int32_t* counts, int32_t* expert_offsets, int32_t* sorted_slots,
                     int32_t* slot_positions, cudaStream_t stream, int32_t* experts_touched = nullptr);

// Step 1 alone, for steps that do not group their rows (MoeRowGatedGemv, MoeRowDownCombine: kernels/moe_products.h).
cudaError_t MoeTopK(const float* logits, int64_t rows, int32_t experts, int32_t k, bool normalize, int32_t* topk_ids,
                    float* topk_weights, cudaStream_t stream);

// The rows each slot of the grouped order reads: out[i] = x[sorted_slots[i] / k] ([rows, n] in, [rows * k, n]
// out), in T (__nv_bfloat16 or __half). n a multiple of 8, x and out 16-byte aligned.
template <typename T>
cudaError_t MoeGather(const T* x, const int32_t* sorted_slots, int64_t slots, int32_t k, int64_t n, T* out,
                      cudaStream_t stream);

// Each row's experts' outputs weighted and summed back, in k order (fp32, rounded once):
// out[r] = Σ_j topk_weights[r, j] · y[slot_positions[r · k + j]] ([rows * k, n] grouped in, [rows, n] out).
template <typename T>
cudaError_t MoeCombine(const T* y, const int32_t* slot_positions, const float* topk_weights, int64_t rows, int32_t k,
                       int64_t n, T* out, cudaStream_t stream);

}  // namespace inferd::kernels

// A mixture of experts' products for the few rows of a decode step (after kernels::MoeRoute): each expert's run of
// rows (the slots grouped by expert, their rows gathered in that order) times that expert's weights, streaming
// only the weights of experts some row chose. The runs' lengths are read on the device, so the call captures into
// a decode graph whatever the routing. Y[i] = X[i] · W_eᵀ for i in expert e's run [offsets[e], offsets[e + 1]),
// W_e = w + e · n · k (the experts' weights stacked). fp32 accumulation, Y rounded once to T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/elementwise.h"
#include "kernels/fp8.h"

namespace inferd::kernels {

// x: [slots, k] and y: [slots, n] in the grouped order; w: [experts, n, k]; offsets: [experts + 1] (MoeRoute's).
// k a multiple of 8, x and w 16-byte aligned. An expert's run of any length is taken, in passes of 8 rows (each
// pass streams its weights again: meant for decode, where a run holds a row or two).
template <typename T>
cudaError_t MoeExpertGemv(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                          cudaStream_t stream);

// The same products for steps of many rows (prefill): a block takes a tile of 64 rows of one expert's run against
// 128 of its weights' rows on the tensor cores, so each expert's weights are read once per tile of its rows, not
// once per 8. Which expert and tile a block takes is found on the device from the offsets (the grid covers
// max_slots rows plus a partial tile per expert). Same layouts; fp32 accumulation, Y rounded once to T; k a
// multiple of 32 (MoeExpertGemmSupports).
bool MoeExpertGemmSupports(const void* x, const void* w, int64_t n, int64_t k);
template <typename T>
cudaError_t MoeExpertGemm(const T* x, const T* w, const int32_t* offsets, int32_t experts, int64_t max_slots, T* y,
                          int64_t n, int64_t k, cudaStream_t stream);

// The same block for steps whose rows are few enough that reading an expert's weights once per row that chose it
// costs less than grouping the rows by expert (a single row: its experts are distinct), in slot order (s = row ·
// top_k + j, as MoeTopK writes them), with no gather and no separate combine:
//   MoeRowGatedGemv: out[s] = act(x[s / top_k] · Wg_eᵀ) · (x[s / top_k] · Wu_eᵀ), e = topk_ids[s], w: [experts,
//     2 · inter, k] (each expert's gate rows, then its up rows), out: [rows · top_k, inter];
//   MoeRowDownCombine: out[r] = Σ_j topk_weights[s] · (act[s] · W_eᵀ rounded to T), s = r · top_k + j in j order,
//     w: [experts, n, k], act: [rows · top_k, k], out: [rows, n].
// Bit for bit MoeExpertGemv, ActivateMul, MoeExpertGemv and MoeCombine (the same sums in the same order).
// k a multiple of 8, x, act and w 16-byte aligned.
template <typename T>
cudaError_t MoeRowGatedGemv(const T* x, const T* w, const int32_t* topk_ids, int64_t rows, int32_t top_k, T* out,
                            int64_t inter, int64_t k, GatedActivation act, cudaStream_t stream);
template <typename T>
cudaError_t MoeRowDownCombine(const T* act, const T* w, const int32_t* topk_ids, const float* topk_weights,
                              int64_t rows, int32_t top_k, T* out, int64_t n, int64_t k, cudaStream_t stream);

// The three streaming products with e4m3 experts (`engine.quantization: fp8`: kernels/fp8.h), the activations in T
// (W8A16): each weight row's sum times its scale, w_scale [experts, rows of one expert's w] (for the gated product
// its gate rows' scales, then its up rows'), then as above. k a multiple of 16.
template <typename T>
cudaError_t MoeExpertGemv(const T* x, const Fp8* w, const float* w_scale, const int32_t* offsets, int32_t experts, T* y,
                          int64_t n, int64_t k, cudaStream_t stream);
template <typename T>
cudaError_t MoeRowGatedGemv(const T* x, const Fp8* w, const float* w_scale, const int32_t* topk_ids, int64_t rows,
                            int32_t top_k, T* out, int64_t inter, int64_t k, GatedActivation act, cudaStream_t stream);
template <typename T>
cudaError_t MoeRowDownCombine(const T* act, const Fp8* w, const float* w_scale, const int32_t* topk_ids,
                              const float* topk_weights, int64_t rows, int32_t top_k, T* out, int64_t n, int64_t k,
                              cudaStream_t stream);

}  // namespace inferd::kernels

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

namespace inferd::kernels {

// x: [slots, k] and y: [slots, n] in the grouped order; w: [experts, n, k]; offsets: [experts + 1] (MoeRoute's).
// k a multiple of 8, x and w 16-byte aligned. An expert's run of any length is taken, in passes of 8 rows (each
// pass streams its weights again: meant for decode, where a run holds a row or two).
template <typename T>
cudaError_t MoeExpertGemv(const T* x, const T* w, const int32_t* offsets, int32_t experts, T* y, int64_t n, int64_t k,
                          cudaStream_t stream);

}  // namespace inferd::kernels

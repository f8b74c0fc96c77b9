// Fills a shard of a random tensor in place (model.load_format dummy): out[r, c] = RandomWeight(seed, first_row + r,
// col_begin + c, mean, std) rounded to T (round to nearest even), for T = __nv_bfloat16 or __half. out: [rows, cols].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

template <typename T>
cudaError_t FillRandomRows(T* out, int64_t rows, int64_t cols, int64_t first_row, int64_t col_begin, uint64_t seed,
                           float mean, float std, cudaStream_t stream);

}  // namespace inferd::kernels

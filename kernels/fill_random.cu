#include "kernels/fill_random.h"
#include "kernels/random_weights.h"

namespace inferd::kernels {
namespace {

template <typename T>
__device__ T FromFloat(float v);
template <>
__device__ __nv_bfloat16 FromFloat(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half FromFloat(float v) {
  return __float2half_rn(v);
}

template <typename T>
__global__ void FillRandomKernel(T* out, int64_t n, int64_t cols, int64_t first_row, int64_t col_begin, uint64_t seed,
                                 float mean, float std) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = FromFloat<T>(RandomWeight(seed, first_row + r, col_begin + c, mean, std));
  }
}

}  // namespace

template <typename T>
cudaError_t FillRandomRows(T* out, int64_t rows, int64_t cols, int64_t first_row, int64_t col_begin, uint64_t seed,
                           float mean, float std, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  FillRandomKernel<T><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      out, n, cols, first_row, col_begin, seed, mean, std);
  return cudaGetLastError();
}

template cudaError_t FillRandomRows(__nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, uint64_t, float, float,
                                    cudaStream_t);
template cudaError_t FillRandomRows(__half*, int64_t, int64_t, int64_t, int64_t, uint64_t, float, float, cudaStream_t);

}  // namespace inferd::kernels

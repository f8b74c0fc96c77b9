// kernels/fp8_gemm.h's tiles of 64 rows: 64 × 64 × 128 in clusters of 8 along n (the rows' tile multicast to eight
// CTAs: many CTAs for the few rows of a decode step), 64 × 128 × 128 in pairs along n; both ping-pong.
#include "kernels/fp8_gemm_kernel.cuh"

namespace inferd::kernels::fp8_gemm {

using cute::_1;
using cute::_128;
using cute::_2;
using cute::_64;
using cute::_8;
using cute::Shape;

cudaError_t Run64x64(const Args& a) {
  return Run<ScaledFp8<Shape<_64, _64, _128>, Shape<_1, _8, _1>, Pingpong>>(a);
}

cudaError_t Run64x128(const Args& a) {
  return Run<ScaledFp8<Shape<_64, _128, _128>, Shape<_1, _2, _1>, Pingpong>>(a);
}

}  // namespace inferd::kernels::fp8_gemm

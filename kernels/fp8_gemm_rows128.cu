// kernels/fp8_gemm.h's tiles of 128 rows: 128 × 64 × 128 ping-pong in clusters of 8 along n (the rows' tile
// multicast to eight CTAs, each weight tile read once); 128 × 128 × 128 ping-pong and 128 × 256 × 128 cooperative
// (the two consumer warp groups on one tile, 64 rows each), both in pairs along m (the weights' tile multicast to
// two CTAs).
#include "kernels/fp8_gemm_kernel.cuh"

namespace inferd::kernels::fp8_gemm {

using cute::_1;
using cute::_128;
using cute::_2;
using cute::_256;
using cute::_64;
using cute::_8;
using cute::Shape;

cudaError_t Run128x64(const Args& a) {
  return Run<ScaledFp8<Shape<_128, _64, _128>, Shape<_1, _8, _1>, Pingpong>>(a);
}

cudaError_t Run128x128(const Args& a) {
  return Run<ScaledFp8<Shape<_128, _128, _128>, Shape<_2, _1, _1>, Pingpong>>(a);
}

cudaError_t Run128x256(const Args& a) {
  return Run<ScaledFp8<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Cooperative>>(a);
}

}  // namespace inferd::kernels::fp8_gemm

// The kernels the device's ceilings are measured with: a large read-only reduction (the read-streaming ceiling
// that bandwidth utilisation is relative to) and a random fill for the GEMM ceiling's operands (constant data
// draws less power and runs faster than real weights). Raw pointers + sizes + stream in, cudaError_t out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// *out += sum of data[0 .. n4) (all four lanes). 16-byte loads, a grid of num_sms * 4 blocks.
cudaError_t ReadReduce(const float4* data, int64_t n4, float* out, int num_sms, cudaStream_t stream);

// data[i] = a 16-bit float (bf16 when bf16, else fp16) uniform in [-1, 1), from a hash of (seed, i): the same
// values for the same seed on every device.
cudaError_t FillUniform16(void* data, int64_t n, bool bf16, uint64_t seed, cudaStream_t stream);
// The value FillUniform16 writes at index i, as a float before rounding to 16 bits (the tests' reference).
float UniformAt(uint64_t seed, int64_t i);

}  // namespace inferd::kernels

// A large read-only reduction: the read-streaming ceiling that decode bandwidth utilisation is measured
// against. Raw pointers + sizes + stream in, cudaError_t out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace inferd::kernels {

// *out += sum of data[0 .. n4) (all four lanes). 16-byte loads, a grid of num_sms * 4 blocks.
cudaError_t ReadReduce(const float4* data, int64_t n4, float* out, int num_sms, cudaStream_t stream);

}  // namespace inferd::kernels

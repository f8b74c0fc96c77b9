// The device's ceilings, measured with small kernels after a warm-up (the GPU idles at low clocks): the
// read-streaming bandwidth and the GEMM rate that bandwidth and FLOPs utilisation are relative to. The
// backend measures them at start-up; inferd-bench calls the same functions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/gemm.h"

namespace inferd::cuda {

// Bytes per second of a read-only reduction over `bytes` of random device memory (median of timed runs).
absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, cudaStream_t stream);
// FLOPs per second of gemm at n × n × n on random operands of its dtype at the GPU's top clock (the best of
// windows of timed runs over 400 ms of load).
// fp8: both operands e4m3 (quantized per row from those random values), per-row scales in the epilogue, as the
// fp8 products run.
absl::StatusOr<double> MeasureGemmRate(Gemm& gemm, bool bf16, int64_t n, cudaStream_t stream, bool fp8 = false);

}  // namespace inferd::cuda

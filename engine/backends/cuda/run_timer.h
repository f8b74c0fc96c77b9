// Times GPU work with CUDA events: the one timing loop of the start-up ceilings, the cuBLASLt algorithm choice
// and inferd-bench.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferd::cuda {

// Milliseconds of each of `runs` calls of fn on `stream`, enqueued back to back with an event between runs, so
// the GPU does not wait on the host between them. A failing fn stops the loop and is returned.
absl::StatusOr<std::vector<float>> TimeRuns(const std::function<absl::Status()>& fn, int runs, cudaStream_t stream);

// The median of times (which must not be empty).
float Median(std::vector<float> times);

}  // namespace inferd::cuda

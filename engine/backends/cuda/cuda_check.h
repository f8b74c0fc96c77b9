// Every CUDA and cuBLAS status becomes an absl::Status that names the call. Only for the cuda backend.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace inferd::cuda {

inline absl::Status FromCuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code =
      e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

inline absl::Status FromCublas(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")"));
}

}  // namespace inferd::cuda

#define INFERD_CUDA(expr) INFERD_RETURN_IF_ERROR(::inferd::cuda::FromCuda((expr), #expr))
#define INFERD_CUBLAS(expr) INFERD_RETURN_IF_ERROR(::inferd::cuda::FromCublas((expr), #expr))

// Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias[n]): bf16/fp16 operands, fp32 accumulation, output in the operand dtype
// or fp32 (logits). Products of up to gemv_max_rows() rows (decode steps) run our weight-streaming kernel
// (kernels/gemv.h); larger ones run cuBLASLt, with its heuristic's algorithm chosen once per shape and cached.
// Row-major on our side.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/device_buffer.h"

namespace inferd::cuda {

class Gemm {
 public:
  ~Gemm();
  // dtype: CUDA_R_16BF or CUDA_R_16F.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(cudaDataType_t dtype, int64_t* device_bytes);
  // y: [m, n] of the operand dtype, or fp32 when out_fp32. bias: [n] of the operand dtype, or null.
  absl::Status Run(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k, const void* bias,
                   bool out_fp32, cudaStream_t stream);
  // Products of at most this many rows use the streaming kernel (0: cuBLASLt for every product).
  int64_t gemv_max_rows() const { return gemv_max_rows_; }
  void set_gemv_max_rows(int64_t rows) { gemv_max_rows_ = rows; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  absl::StatusOr<Plan*> PlanFor(int64_t m, int64_t n, int64_t k, bool bias, bool out_fp32);

  Gemm() = default;
  cublasLtHandle_t handle_ = nullptr;
  cudaDataType_t dtype_ = CUDA_R_16BF;
  int64_t gemv_max_rows_ = 0;
  DeviceBuffer workspace_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool>, Plan> plans_;
};

}  // namespace inferd::cuda

// Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias[n]): bf16/fp16 operands, fp32 accumulation, output in the operand dtype
// or fp32 (logits). Products of up to gemv_max_rows() rows (decode steps) run our weight-streaming kernel
// (kernels/gemv.h); larger ones run cuBLASLt: the algorithm Tune() measured fastest for the shape, else the
// heuristic's first, chosen once per shape and cached. Row-major on our side.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/device_buffer.h"

namespace inferd::cuda {

class Gemm {
 public:
  ~Gemm();
  // dtype: CUDA_R_16BF or CUDA_R_16F. workspace_bytes: cuBLASLt's (DeviceLayout::gemm_workspace_bytes).
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(cudaDataType_t dtype, int64_t workspace_bytes,
                                                      int64_t* device_bytes);
  // y: [m, n] of the operand dtype, or fp32 when out_fp32. bias: [n] of the operand dtype, or null.
  absl::Status Run(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k, const void* bias,
                   bool out_fp32, cudaStream_t stream);
  // Times up to kTuneCandidates of cuBLASLt's heuristic algorithms for this shape (weights cycled through
  // `weights` so that none is served from L2) and keeps the fastest for every later Run of the shape. Returns
  // the heuristic's first algorithm's time over the chosen one's (1 when it was already the fastest).
  absl::StatusOr<double> Tune(const void* x, std::span<const void* const> weights, void* y, int64_t m, int64_t n,
                              int64_t k, const void* bias, bool out_fp32, cudaStream_t stream);
  static constexpr int kTuneCandidates = 8;
  // Products of at most this many rows use the streaming kernel (0: cuBLASLt for every product).
  int64_t gemv_max_rows() const { return gemv_max_rows_; }
  void set_gemv_max_rows(int64_t rows) { gemv_max_rows_ = rows; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  // The plan of this shape, its algorithm the heuristic's first (or, with `candidates`, its first n).
  absl::StatusOr<Plan*> PlanFor(int64_t m, int64_t n, int64_t k, bool bias, bool out_fp32,
                                std::vector<cublasLtMatmulAlgo_t>* candidates = nullptr);

  Gemm() = default;
  cublasLtHandle_t handle_ = nullptr;
  cudaDataType_t dtype_ = CUDA_R_16BF;
  int64_t gemv_max_rows_ = 0;
  DeviceBuffer workspace_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool>, Plan> plans_;
};

}  // namespace inferd::cuda

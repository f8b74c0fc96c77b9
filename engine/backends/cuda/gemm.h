// Y[m, n] = X[m, k] · W[n, k]ᵀ (+ bias[n]): bf16/fp16 operands, or fp8 e4m3 ones with per-row scales
// (kernels/fp8.h), fp32 accumulation, output in the compute dtype or fp32 (logits). Products of up to
// streaming_rows() rows (decode steps) run our weight-streaming kernels (kernels/gemv.h; kernels/fp8.h for fp8
// weights, whose activations then stay in the compute dtype); larger ones run cuBLASLt (fp8 ones on Hopper in bf16:
// CUTLASS's kernel, kernels/fp8_gemm.h), fp8 ones with the per-token and per-channel scales applied in the epilogue:
// the algorithm (CUTLASS: the tile) Tune() measured fastest for the shape, else the heuristic's first (CUTLASS: the
// tile by the rows), chosen once per shape and cached.
// Row-major on our side.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/device_buffer.h"
#include "kernels/fp8_gemm.h"

namespace inferd::cuda {

// A product's operand: rows in the compute dtype, or fp8 e4m3 rows each scaled by scale[row] (per_tensor: all
// by scale[0]; both operands of a product are per-row or both per-tensor).
struct Operand {
  Operand(const void* data, const float* scale = nullptr, bool per_tensor = false)  // NOLINT: implicit
      : data(data), scale(scale), per_tensor(per_tensor) {}
  const void* data;
  const float* scale;
  bool per_tensor;
  bool fp8() const { return scale != nullptr; }
};

class Gemm {
 public:
  ~Gemm();
  // dtype: CUDA_R_16BF or CUDA_R_16F. workspace_bytes: cuBLASLt's (DeviceLayout::gemm_workspace_bytes).
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(cudaDataType_t dtype, int64_t workspace_bytes,
                                                      int64_t* device_bytes);
  // y: [m, n] of the compute dtype, or fp32 when out_fp32, its rows ldy ≥ n elements apart (0: n; bf16/fp16
  // weights only). bias: [n] of the compute dtype, or null. x and w are both fp8 (cuBLASLt, m >
  // streaming_rows(true)), both not, or w fp8 and x not (the streaming kernel).
  absl::Status Run(Operand x, Operand w, void* y, int64_t m, int64_t n, int64_t k, const void* bias, bool out_fp32,
                   cudaStream_t stream, int64_t ldy = 0);
  // Times up to kTuneCandidates of cuBLASLt's heuristic algorithms for this shape (weights cycled through
  // `weights` so that none is served from L2) and keeps the fastest for every later Run of the shape; for the fp8
  // products CUTLASS runs, each of its tiles (kernels::kFp8GemmTiles). Returns the heuristic's first algorithm's
  // (the tile by the rows') time over the chosen one's (1 when it was already the fastest).
  absl::StatusOr<double> Tune(Operand x, std::span<const Operand> weights, void* y, int64_t m, int64_t n, int64_t k,
                              const void* bias, bool out_fp32, cudaStream_t stream, int64_t ldy = 0);
  static constexpr int kTuneCandidates = 8;
  // Products of at most this many rows use the streaming kernel (0: cuBLASLt for every product), for bf16/fp16
  // weights and for fp8 ones.
  int64_t gemv_max_rows() const { return gemv_max_rows_; }
  void set_gemv_max_rows(int64_t rows) { gemv_max_rows_ = rows; }
  int64_t fp8_gemv_max_rows() const { return fp8_gemv_max_rows_; }
  void set_fp8_gemv_max_rows(int64_t rows) { fp8_gemv_max_rows_ = rows; }
  int64_t streaming_rows(bool fp8_weights) const { return fp8_weights ? fp8_gemv_max_rows_ : gemv_max_rows_; }
  // fp8 products of per-row scaled operands beyond the streaming rows: CUTLASS's kernel with both scales in its
  // epilogue (kernels/fp8_gemm.h, Hopper, bf16 output) where it runs the shape, else cuBLASLt; off: cuBLASLt.
  bool fp8_cutlass() const { return fp8_cutlass_; }
  void set_fp8_cutlass(bool on) { fp8_cutlass_ = on; }
  // The CUTLASS tile Run takes for an fp8 product of this shape: Tune's choice, else kernels::Fp8GemmTileFor(m).
  kernels::Fp8GemmTile cutlass_tile(int64_t m, int64_t n, int64_t k) const;
  // Tune's choices so far, by (m, n, k).
  const std::map<std::tuple<int64_t, int64_t, int64_t>, kernels::Fp8GemmTile>& cutlass_tiles() const {
    return cutlass_tiles_;
  }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  // The plan of this shape, its algorithm the heuristic's first (or, with `candidates`, its first n).
  // scales: kNone (bf16/fp16 operands), kPerRow (fp8, outer-vector scales) or kPerTensor (fp8, scalar scales).
  enum Scales { kNone, kPerRow, kPerTensor };
  static absl::StatusOr<Scales> ScalesOf(Operand x, Operand w);
  // The output's row pitch (0: n) and the alignment in bytes (at most 256) of every row's start.
  struct Output {
    int64_t ldy = 0, align = 256;
  };
  Output OutputOf(const void* y, int64_t ldy, int64_t n, bool out_fp32) const;
  absl::StatusOr<Plan*> PlanFor(int64_t m, int64_t n, int64_t k, bool bias, bool out_fp32, Scales scales, Output out,
                                std::vector<cublasLtMatmulAlgo_t>* candidates = nullptr);
  // Whether Run takes this product to CUTLASS's fp8 kernel (kernels/fp8_gemm.h) rather than cuBLASLt.
  bool RunsOnCutlass(Operand x, Operand w, const void* y, const void* bias, int64_t n, int64_t k, bool out_fp32,
                     int64_t ldy, Scales scales) const;
  // Tune for the products CUTLASS runs: each tile of kernels::kFp8GemmTiles timed, the fastest kept.
  absl::StatusOr<double> TuneCutlass(Operand x, std::span<const Operand> weights, void* y, int64_t m, int64_t n,
                                     int64_t k, const void* bias, cudaStream_t stream);
  // Points the plan at this call's bias and fp8 scales.
  absl::Status Bind(Plan* p, Operand x, Operand w, const void* bias);

  Gemm() = default;
  cublasLtHandle_t handle_ = nullptr;
  cudaDataType_t dtype_ = CUDA_R_16BF;
  int64_t gemv_max_rows_ = 0;
  int64_t fp8_gemv_max_rows_ = 0;
  bool fp8_cutlass_ = true;
  bool fp8_cutlass_available_ = false;  // this GPU runs kernels/fp8_gemm.h (asked once, at Create)
  DeviceBuffer workspace_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, Scales, int64_t, int64_t>, Plan> plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, kernels::Fp8GemmTile> cutlass_tiles_;  // (m, n, k): Tune's choice
};

}  // namespace inferd::cuda

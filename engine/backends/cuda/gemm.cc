#include "engine/backends/cuda/gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda/run_timer.h"
#include "kernels/fp8.h"
#include "kernels/gemv.h"

namespace inferd::cuda {
namespace {

// The streaming kernel beats cuBLASLt on the 8B model's decode chain at one row on CUDA cores (5.11 vs 5.56 ms)
// and at 2-8 rows as tensor-core tiles (kernels/gemv_tiles.cuh: 5.44-5.56 vs 5.62-5.66 ms), and lets RoPE and
// SiLU·mul fuse into the products: `inferd-bench --sections products`, kernels/NOTES.md.
constexpr int64_t kStreamingMaxRows = 8;
// fp8 weights: the streaming kernel on tensor cores (kernels/gemv_tiles.cuh) against cuBLASLt's per-token x
// per-channel scaled chain: `inferd-bench --quantization fp8 --sections products`, kernels/NOTES.md.
constexpr int64_t kFp8StreamingMaxRows = 8;

template <typename T>
cudaError_t RunGemv(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k, int64_t ldy,
                    const void* bias, bool out_fp32, cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  const T* bt = static_cast<const T*>(bias);
  return out_fp32 ? kernels::Gemv<T, float>(xt, wt, bt, static_cast<float*>(y), m, n, k, stream, ldy)
                  : kernels::Gemv<T, T>(xt, wt, bt, static_cast<T*>(y), m, n, k, stream, ldy);
}

template <typename T>
cudaError_t RunGemvFp8(const void* x, Operand w, void* y, int64_t m, int64_t n, int64_t k, const void* bias,
                       bool out_fp32, cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const auto* wq = static_cast<const kernels::Fp8*>(w.data);
  const T* bt = static_cast<const T*>(bias);
  return out_fp32 ? kernels::GemvFp8<T, float>(xt, wq, w.scale, bt, static_cast<float*>(y), m, n, k, stream)
                  : kernels::GemvFp8<T, T>(xt, wq, w.scale, bt, static_cast<T*>(y), m, n, k, stream);
}

void Destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c) {
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) Destroy(p.desc, p.a, p.b, p.c);
  if (handle_) cublasLtDestroy(handle_);
}

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(cudaDataType_t dtype, int64_t workspace_bytes,
                                                   int64_t* device_bytes) {
  std::unique_ptr<Gemm> g(new Gemm());
  g->dtype_ = dtype;
  g->gemv_max_rows_ = kStreamingMaxRows;
  g->fp8_gemv_max_rows_ = kFp8StreamingMaxRows;
  int device = 0;
  INFERD_CUDA(cudaGetDevice(&device));
  g->fp8_cutlass_available_ = kernels::Fp8ScaledGemmAvailable(device);
  INFERD_CUBLAS(cublasLtCreate(&g->handle_));
  INFERD_RETURN_IF_ERROR(g->workspace_.Allocate(static_cast<size_t>(workspace_bytes), device_bytes));
  return g;
}

// Row-major Y[m, n] = X[m, k] · W[n, k]ᵀ seen column-major is Y(n × m) = op(A) · B with A = W (k × n,
// transposed), B = X (k × m): the "TN" layout fp8 products require. fp8: A's outer-vector scales are W's
// per-channel ones (n), B's are X's per-token ones (m), applied to each product element before the bias.
absl::StatusOr<Gemm::Scales> Gemm::ScalesOf(Operand x, Operand w) {
  if (x.fp8() != w.fp8()) return absl::InternalError("Gemm: an fp8 input needs fp8 weights, and the other way round");
  if (!w.fp8()) return kNone;
  if (x.per_tensor != w.per_tensor)
    return absl::InternalError("Gemm: fp8 scales are per row on both sides or on neither");
  return w.per_tensor ? kPerTensor : kPerRow;
}

absl::StatusOr<Gemm::Plan*> Gemm::PlanFor(int64_t m, int64_t n, int64_t k, bool bias, bool out_fp32, Scales scales,
                                          Output out, std::vector<cublasLtMatmulAlgo_t>* candidates) {
  const bool fp8 = scales != kNone;
  const int64_t ldy = out.ldy > 0 ? out.ldy : n;
  const auto key = std::make_tuple(m, n, k, bias, out_fp32, scales, ldy, out.align);
  if (auto it = plans_.find(key); it != plans_.end() && !candidates) return &it->second;
  if (auto it = plans_.find(key); it != plans_.end()) {  // asked again for candidates: plan afresh
    Destroy(it->second.desc, it->second.a, it->second.b, it->second.c);
    plans_.erase(it);
  }
  Plan p;
  INFERD_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dtype_, sizeof(dtype_)));
  }
  if (fp8) {
    const int32_t mode =
        scales == kPerRow ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    // Hopper's fp8 tensor cores accumulate in reduced precision unless promoted to fp32 every few k-steps; "fast
    // accumulation" skips the promotion. Kept off, for accuracy.
    const int8_t fast = 0;
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    // The heuristic refuses vector scales without a scale pointer; each run binds its own (Bind).
    const void* placeholder = workspace_.get();
    for (auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER}) {
      INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, attr, &placeholder, sizeof(placeholder)));
    }
  }
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : dtype_;
  INFERD_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, in_type, k, n, k));
  INFERD_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, in_type, k, m, k));
  INFERD_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, out_fp32 ? CUDA_R_32F : dtype_, n, m, ldy));
  cublasLtMatmulPreference_t pref;
  INFERD_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.bytes();
  INFERD_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  if (out.align < 256) {  // cuBLASLt assumes 256-byte aligned outputs unless told
    const uint32_t align = static_cast<uint32_t>(out.align);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      INFERD_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    }
  }
  // Split-K partial sums are reduced in fp32 only: a reduction in the output type rounds every partial sum to
  // bf16, which flips tokens of models with large activations (kernels/NOTES.md, "bf16 parity").
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  INFERD_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                     sizeof(reductions)));
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                                          candidates ? kTuneCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  INFERD_CUBLAS(s);
  if (found == 0) {
    Destroy(p.desc, p.a, p.b, p.c);
    return absl::InternalError(absl::StrCat("cublasLtMatmulAlgoGetHeuristic: no algorithm for m=", m, " n=", n,
                                            " k=", k, out_fp32 ? " (fp32 output)" : "", fp8 ? " (fp8)" : ""));
  }
  p.algo = results[0].algo;
  if (candidates) {
    candidates->clear();
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) candidates->push_back(results[i].algo);
    }
  }
  return &plans_.emplace(key, p).first->second;
}

absl::Status Gemm::Bind(Plan* p, Operand x, Operand w, const void* bias) {
  if (bias) {
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (w.fp8()) {
    INFERD_CUBLAS(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w.scale, sizeof(w.scale)));
    INFERD_CUBLAS(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x.scale, sizeof(x.scale)));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Gemm::Tune(Operand x, std::span<const Operand> weights, void* y, int64_t m, int64_t n, int64_t k,
                                  const void* bias, bool out_fp32, cudaStream_t stream, int64_t ldy) {
  if (weights.empty()) return absl::InvalidArgumentError("Gemm::Tune: no weights");
  INFERD_ASSIGN_OR_RETURN(const Scales scales, ScalesOf(x, weights[0]));
  if (RunsOnCutlass(x, weights[0], y, bias, n, k, out_fp32, ldy, scales)) {
    return TuneCutlass(x, weights, y, m, n, k, bias, stream);
  }
  std::vector<cublasLtMatmulAlgo_t> candidates;
  INFERD_ASSIGN_OR_RETURN(
      Plan * p, PlanFor(m, n, k, bias != nullptr, out_fp32, scales, OutputOf(y, ldy, n, out_fp32), &candidates));
  const float alpha = 1.f, beta = 0.f;
  size_t next = 0;
  absl::Status bound;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    const Operand& w = weights[next++ % weights.size()];
    if (bound = Bind(p, x, w, bias); !bound.ok()) return CUBLAS_STATUS_INVALID_VALUE;
    return cublasLtMatmul(handle_, p->desc, &alpha, w.data, p->a, x.data, p->b, &beta, y, p->c, y, p->c, &algo,
                          workspace_.get(), workspace_.bytes(), stream);
  };
  // Median of 5 timed runs after 2, each candidate in turn; a candidate that fails to run is passed over.
  std::vector<float> median(candidates.size(), -1.f);
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (run(candidates[c]) != CUBLAS_STATUS_SUCCESS || run(candidates[c]) != CUBLAS_STATUS_SUCCESS) continue;
    INFERD_ASSIGN_OR_RETURN(std::vector<float> ms,
                            TimeRuns([&] { return FromCublas(run(candidates[c]), "cublasLtMatmul"); }, 5, stream));
    median[c] = Median(std::move(ms));
  }
  size_t best = 0;
  for (size_t c = 0; c < median.size(); ++c) {
    if (median[c] > 0 && (median[best] <= 0 || median[c] < median[best])) best = c;
  }
  INFERD_RETURN_IF_ERROR(bound);
  if (candidates.empty() || median[best] <= 0) return 1.0;  // nothing measured: the heuristic's first stays
  p->algo = candidates[best];
  return median[0] > 0 ? median[0] / median[best] : 1.0;
}

absl::StatusOr<double> Gemm::TuneCutlass(Operand x, std::span<const Operand> weights, void* y, int64_t m, int64_t n,
                                         int64_t k, const void* bias, cudaStream_t stream) {
  size_t next = 0;
  auto run = [&](kernels::Fp8GemmTile tile) {
    const Operand& w = weights[next++ % weights.size()];
    return FromCuda(kernels::Fp8ScaledGemm(static_cast<const kernels::Fp8*>(x.data), x.scale,
                                           static_cast<const kernels::Fp8*>(w.data), w.scale,
                                           static_cast<const __nv_bfloat16*>(bias), static_cast<__nv_bfloat16*>(y), m,
                                           n, k, stream, tile),
                    "kernels::Fp8ScaledGemm");
  };
  // Median of 5 timed runs after 2, each tile in turn; a tile CUTLASS refuses for the shape is passed over.
  kernels::Fp8GemmTile best = kernels::Fp8GemmTileFor(m);
  float best_ms = 0, by_rows_ms = 0;
  for (const kernels::Fp8GemmTile tile : kernels::kFp8GemmTiles) {
    if (!run(tile).ok()) continue;
    INFERD_RETURN_IF_ERROR(run(tile));
    INFERD_ASSIGN_OR_RETURN(std::vector<float> ms, TimeRuns([&] { return run(tile); }, 5, stream));
    const float median = Median(std::move(ms));
    if (tile == kernels::Fp8GemmTileFor(m)) by_rows_ms = median;
    if (best_ms == 0 || median < best_ms) best = tile, best_ms = median;
  }
  cutlass_tiles_[{m, n, k}] = best;
  return best_ms > 0 ? by_rows_ms / best_ms : 1.0;
}

kernels::Fp8GemmTile Gemm::cutlass_tile(int64_t m, int64_t n, int64_t k) const {
  const auto it = cutlass_tiles_.find({m, n, k});
  return it != cutlass_tiles_.end() ? it->second : kernels::Fp8GemmTileFor(m);
}

bool Gemm::RunsOnCutlass(Operand x, Operand w, const void* y, const void* bias, int64_t n, int64_t k, bool out_fp32,
                         int64_t ldy, Scales scales) const {
  return scales == kPerRow && fp8_cutlass_ && fp8_cutlass_available_ && dtype_ == CUDA_R_16BF && !out_fp32 &&
         (ldy == 0 || ldy == n) && kernels::Fp8ScaledGemmSupports(x.data, w.data, y, bias, n, k);
}

Gemm::Output Gemm::OutputOf(const void* y, int64_t ldy, int64_t n, bool out_fp32) const {
  if (ldy == n) ldy = 0;  // contiguous rows: one plan whichever way the caller says it
  const int64_t e = out_fp32 ? 4 : 2;
  uint64_t bits = reinterpret_cast<uintptr_t>(y) | 256;
  if (ldy > 0) bits |= static_cast<uint64_t>(ldy * e);
  return {ldy, static_cast<int64_t>(bits & -bits)};  // the largest power of two every row start is aligned to
}

absl::Status Gemm::Run(Operand x, Operand w, void* y, int64_t m, int64_t n, int64_t k, const void* bias, bool out_fp32,
                       cudaStream_t stream, int64_t ldy) {
  if (m == 0) return absl::OkStatus();
  const bool bf16 = dtype_ == CUDA_R_16BF;
  if (ldy != 0 && ldy != n && w.fp8()) return absl::InternalError("Gemm::Run: an fp8 product with a row pitch");
  if (w.fp8() && !x.fp8() && !w.per_tensor) {  // inputs in the compute dtype: the streaming kernel's shapes only
    if (m > fp8_gemv_max_rows_ || !kernels::GemvFp8Supports(x.data, w.data, m, k)) {
      return absl::InternalError(absl::StrCat("Gemm::Run: fp8 weights with an unquantized input of ", m, " rows (k=", k,
                                              ") beyond the streaming kernel's ", fp8_gemv_max_rows_));
    }
    const cudaError_t e = bf16 ? RunGemvFp8<__nv_bfloat16>(x.data, w, y, m, n, k, bias, out_fp32, stream)
                               : RunGemvFp8<__half>(x.data, w, y, m, n, k, bias, out_fp32, stream);
    return FromCuda(e, "kernels::GemvFp8");
  }
  INFERD_ASSIGN_OR_RETURN(const Scales scales, ScalesOf(x, w));
  if (RunsOnCutlass(x, w, y, bias, n, k, out_fp32, ldy, scales)) {
    return FromCuda(kernels::Fp8ScaledGemm(static_cast<const kernels::Fp8*>(x.data), x.scale,
                                           static_cast<const kernels::Fp8*>(w.data), w.scale,
                                           static_cast<const __nv_bfloat16*>(bias), static_cast<__nv_bfloat16*>(y), m,
                                           n, k, stream, cutlass_tile(m, n, k)),
                    "kernels::Fp8ScaledGemm");
  }
  if (!w.fp8() && m <= gemv_max_rows_ && kernels::GemvSupports(x.data, w.data, m, k)) {
    const cudaError_t e = bf16 ? RunGemv<__nv_bfloat16>(x.data, w.data, y, m, n, k, ldy, bias, out_fp32, stream)
                               : RunGemv<__half>(x.data, w.data, y, m, n, k, ldy, bias, out_fp32, stream);
    return FromCuda(e, "kernels::Gemv");
  }
  INFERD_ASSIGN_OR_RETURN(Plan * p, PlanFor(m, n, k, bias != nullptr, out_fp32, scales, OutputOf(y, ldy, n, out_fp32)));
  INFERD_RETURN_IF_ERROR(Bind(p, x, w, bias));
  const float alpha = 1.f, beta = 0.f;
  INFERD_CUBLAS(cublasLtMatmul(handle_, p->desc, &alpha, w.data, p->a, x.data, p->b, &beta, y, p->c, y, p->c, &p->algo,
                               workspace_.get(), workspace_.bytes(), stream));
  return absl::OkStatus();
}

}  // namespace inferd::cuda

#include "engine/backends/cuda/gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda/run_timer.h"
#include "kernels/gemv.h"

namespace inferd::cuda {
namespace {

// Up to 2 rows the streaming kernel beats cuBLASLt on the 8B model's decode chain (5.27-5.33 vs 5.53 ms), at 3
// they tie, from 4 cuBLASLt wins: `inferd-bench --products-only`, kernels/NOTES.md.
constexpr int64_t kStreamingMaxRows = 2;

template <typename T>
cudaError_t RunGemv(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k, const void* bias,
                    bool out_fp32, cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  const T* bt = static_cast<const T*>(bias);
  return out_fp32 ? kernels::Gemv<T, float>(xt, wt, bt, static_cast<float*>(y), m, n, k, stream)
                  : kernels::Gemv<T, T>(xt, wt, bt, static_cast<T*>(y), m, n, k, stream);
}

}  // namespace

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (handle_) cublasLtDestroy(handle_);
}

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(cudaDataType_t dtype, int64_t workspace_bytes,
                                                   int64_t* device_bytes) {
  std::unique_ptr<Gemm> g(new Gemm());
  g->dtype_ = dtype;
  g->gemv_max_rows_ = kStreamingMaxRows;
  INFERD_CUBLAS(cublasLtCreate(&g->handle_));
  INFERD_RETURN_IF_ERROR(g->workspace_.Allocate(static_cast<size_t>(workspace_bytes), device_bytes));
  return g;
}

// Row-major Y[m, n] = X[m, k] · W[n, k]ᵀ seen column-major is Y(n × m) = op(A) · B with A = W (k × n,
// transposed), B = X (k × m).
absl::StatusOr<Gemm::Plan*> Gemm::PlanFor(int64_t m, int64_t n, int64_t k, bool bias, bool out_fp32,
                                          std::vector<cublasLtMatmulAlgo_t>* candidates) {
  const auto key = std::make_tuple(m, n, k, bias, out_fp32);
  if (auto it = plans_.find(key); it != plans_.end() && !candidates) return &it->second;
  if (auto it = plans_.find(key); it != plans_.end()) {  // asked again for candidates: plan afresh
    cublasLtMatrixLayoutDestroy(it->second.a);
    cublasLtMatrixLayoutDestroy(it->second.b);
    cublasLtMatrixLayoutDestroy(it->second.c);
    cublasLtMatmulDescDestroy(it->second.desc);
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
  INFERD_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, dtype_, k, n, k));
  INFERD_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, dtype_, k, m, k));
  INFERD_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, out_fp32 ? CUDA_R_32F : dtype_, n, m, n));
  cublasLtMatmulPreference_t pref;
  INFERD_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.bytes();
  INFERD_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
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
    return absl::InternalError(absl::StrCat("cublasLtMatmulAlgoGetHeuristic: no algorithm for m=", m, " n=", n,
                                            " k=", k, out_fp32 ? " (fp32 output)" : ""));
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

absl::StatusOr<double> Gemm::Tune(const void* x, std::span<const void* const> weights, void* y, int64_t m, int64_t n,
                                  int64_t k, const void* bias, bool out_fp32, cudaStream_t stream) {
  std::vector<cublasLtMatmulAlgo_t> candidates;
  INFERD_ASSIGN_OR_RETURN(Plan * p, PlanFor(m, n, k, bias != nullptr, out_fp32, &candidates));
  if (bias) {
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.f, beta = 0.f;
  size_t next = 0;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    const void* w = weights[next++ % weights.size()];
    return cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &algo, workspace_.get(),
                          workspace_.bytes(), stream);
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
  if (candidates.empty() || median[best] <= 0) return 1.0;  // nothing measured: the heuristic's first stays
  p->algo = candidates[best];
  return median[0] > 0 ? median[0] / median[best] : 1.0;
}

absl::Status Gemm::Run(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k, const void* bias,
                       bool out_fp32, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  if (m <= gemv_max_rows_ && kernels::GemvSupports(x, w, m, k)) {
    const cudaError_t e = dtype_ == CUDA_R_16BF ? RunGemv<__nv_bfloat16>(x, w, y, m, n, k, bias, out_fp32, stream)
                                                : RunGemv<__half>(x, w, y, m, n, k, bias, out_fp32, stream);
    return FromCuda(e, "kernels::Gemv");
  }
  INFERD_ASSIGN_OR_RETURN(Plan * p, PlanFor(m, n, k, bias != nullptr, out_fp32));
  if (bias) {
    INFERD_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.f, beta = 0.f;
  INFERD_CUBLAS(cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                               workspace_.get(), workspace_.bytes(), stream));
  return absl::OkStatus();
}

}  // namespace inferd::cuda

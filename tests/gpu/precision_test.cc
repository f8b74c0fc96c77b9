// Each product and attention kernel of the forward pass against an fp64 reference computed from the same bf16 or
// fp16 inputs, at the scale of a model with large activations (weights drawn with std 0.2: q and k elements of
// std ~4.5, attention logits of std ~20, sums over 1024 terms). The error is stated in units of the error that
// rounding the exact result once to the output dtype makes, so a kernel that rounds or reduces an intermediate
// in 16 bits shows as a ratio well above 1 in bf16 (and hides in fp16, whose rounding is 8 times finer).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "engine/backends/cuda/gemm.h"
#include "engine/runtime/device_layout.h"
#include "kernels/paged_attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::Dev;
using testing::HaveGpu;

template <typename T>
float Round(float v);
template <>
float Round<__nv_bfloat16>(float v) {
  return __bfloat162float(__float2bfloat16(v));
}
template <>
float Round<__half>(float v) {
  return __half2float(__float2half(v));
}
template <typename T>
T To(float v);
template <>
__nv_bfloat16 To<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__half To<__half>(float v) {
  return __float2half(v);
}
inline float From(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
inline float From(__half v) {
  return __half2float(v);
}
inline float From(float v) {
  return v;
}

// Random values of std `scale`, already representable in T (so the reference sees the kernel's inputs).
template <typename T>
std::vector<float> RandomIn(size_t n, std::mt19937& rng, float scale) {
  std::vector<float> v = testing::Random(n, rng, scale);
  for (float& x : v) x = Round<T>(x);
  return v;
}
template <typename T>
std::vector<T> Convert(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = To<T>(v[i]);
  return out;
}

// ‖got − ref‖ over ‖round(ref) − ref‖: 1 for a kernel as exact as its output dtype allows.
template <typename T, typename Out>
double ErrorInRoundings(const std::vector<Out>& got, const std::vector<double>& ref) {
  double err = 0, one = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = From(got[i]);
    if (std::isnan(g)) return INFINITY;
    err += (g - ref[i]) * (g - ref[i]);
    const double r = std::is_same_v<Out, float> ? static_cast<double>(static_cast<float>(ref[i]))
                                                : static_cast<double>(Round<T>(static_cast<float>(ref[i])));
    one += (r - ref[i]) * (r - ref[i]);
  }
  return std::sqrt(err / std::max(one, 1e-300));
}

constexpr const char* kName[] = {"bf16", "fp16"};

// Products of the sharp model's shapes (hidden 512, 4 heads of 128 on 1 KV head, intermediate 1024, vocabulary
// 1100) at the row counts of decode steps, small batches and prefill chunks, through the backend's Gemm after
// Tune() chose its algorithms by measurement (the path the decode graphs and prefill steps take).
template <typename T>
void ProductsAreAsExactAsOneRounding(cudaDataType_t dtype) {
  struct Shape {
    const char* name;
    int64_t n, k;
    bool bias, out_fp32;
  };
  const Shape shapes[] = {{"qkv", 768, 512, true, false},
                          {"o", 512, 512, false, false},
                          {"gate_up", 2048, 512, false, false},
                          {"down", 512, 1024, false, false},
                          {"lm_head", 1100, 512, false, true}};
  int64_t device_bytes = 0;
  auto gemm = cuda::Gemm::Create(dtype, kGemmWorkspaceBytes, &device_bytes);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937 rng(7);
  for (const Shape& s : shapes) {
    for (int64_t m : {1, 2, 3, 8, 22, 64, 200, 759}) {
      // x: a norm's output (std ~1, the norm weights near 1) or an activation of std ~4.5 for o and down.
      const float x_scale = (std::string(s.name) == "o" || std::string(s.name) == "down") ? 4.5f : 1.f;
      const std::vector<float> x = RandomIn<T>(m * s.k, rng, x_scale), w = RandomIn<T>(s.n * s.k, rng, 0.2f),
                               b = RandomIn<T>(s.n, rng, 0.2f);
      Dev<T> dx(Convert<T>(x)), dw(Convert<T>(w)), db(Convert<T>(b));
      std::vector<double> ref(m * s.n);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < s.n; ++c) {
          double acc = s.bias ? b[c] : 0.0;
          for (int64_t i = 0; i < s.k; ++i) acc += double{x[r * s.k + i]} * w[c * s.k + i];
          ref[r * s.n + c] = acc;
        }
      const cuda::Operand weights[] = {dw.get()};
      double ratio = 0;
      if (s.out_fp32) {
        Dev<float> y(m * s.n);
        ASSERT_TRUE((*gemm)->Tune(dx.get(), weights, y.get(), m, s.n, s.k, nullptr, true, nullptr).ok());
        ASSERT_TRUE((*gemm)->Run(dx.get(), dw.get(), y.get(), m, s.n, s.k, nullptr, true, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        // fp32 output: measured against the reference rounded to bf16/fp16 once, the finest the operands allow.
        std::vector<float> got = y.Host();
        std::vector<T> as_t(got.size());
        for (size_t i = 0; i < got.size(); ++i) as_t[i] = To<T>(got[i]);
        ratio = ErrorInRoundings<T>(as_t, ref);
      } else {
        Dev<T> y(m * s.n);
        const void* bias = s.bias ? static_cast<const void*>(db.get()) : nullptr;
        ASSERT_TRUE((*gemm)->Tune(dx.get(), weights, y.get(), m, s.n, s.k, bias, false, nullptr).ok());
        ASSERT_TRUE((*gemm)->Run(dx.get(), dw.get(), y.get(), m, s.n, s.k, bias, false, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ratio = ErrorInRoundings<T>(y.Host(), ref);
      }
      std::printf("[ precision] %s %-8s m %4ld n %4ld k %4ld: error %.2f roundings\n", kName[std::is_same_v<T, __half>],
                  s.name, static_cast<long>(m), static_cast<long>(s.n), static_cast<long>(s.k), ratio);
      // One rounding of the output plus fp32 accumulation (whose error is far below it): within 1.5.
      EXPECT_LT(ratio, 1.5) << s.name << " m=" << m;
    }
  }
}

TEST(Precision, Bf16ProductsAreAsExactAsOneRounding) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  ProductsAreAsExactAsOneRounding<__nv_bfloat16>(CUDA_R_16BF);
}
TEST(Precision, Fp16ProductsAreAsExactAsOneRounding) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  ProductsAreAsExactAsOneRounding<__half>(CUDA_R_16F);
}

// Every algorithm cuBLASLt's heuristic offers for the sharp model's products in bf16: those that split K and
// reduce the partial sums in fp32 (or do not split) are within one rounding; those that reduce in the output
// type (bf16) are printed with their error: the backend's Gemm asks for fp32 reductions only.
TEST(Precision, Bf16CublasLtAlgorithmsThatReduceInFp32AreAsExactAsOneRounding) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  using T = __nv_bfloat16;
  cublasLtHandle_t handle;
  ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const size_t ws_bytes = size_t{32} << 20;
  Dev<char> ws(ws_bytes);
  std::mt19937 rng(9);
  int checked = 0;
  // The sharp model's products, then the Llama-3-8B shape's o (4096 x 4096) and down (4096 x 14336) products at
  // decode batch sizes, where splitting K pays most.
  struct Case {
    int64_t n, k;
    std::vector<int64_t> rows;
  };
  const Case cases[] = {{512, 1024, {3, 8, 22, 64, 200}},
                        {512, 512, {3, 8, 22, 64, 200}},
                        {768, 512, {3, 8, 22, 64, 200}},
                        {4096, 4096, {3, 16, 64}},
                        {4096, 14336, {3, 16, 64}}};
  for (const Case& shape : cases) {
    const int64_t n = shape.n, k = shape.k;
    for (int64_t m : shape.rows) {
      const std::vector<float> x = RandomIn<T>(m * k, rng, 4.5f), w = RandomIn<T>(n * k, rng, 0.2f);
      Dev<T> dx(Convert<T>(x)), dw(Convert<T>(w)), y(m * n);
      std::vector<double> ref(m * n);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          double acc = 0;
          for (int64_t i = 0; i < k; ++i) acc += double{x[r * k + i]} * w[c * k + i];
          ref[r * n + c] = acc;
        }
      cublasLtMatmulDesc_t desc;
      cublasLtMatrixLayout_t a, b, cl;
      ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
      cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k);
      cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k);
      cublasLtMatrixLayoutCreate(&cl, CUDA_R_16BF, n, m, n);
      cublasLtMatmulPreference_t pref;
      cublasLtMatmulPreferenceCreate(&pref);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
      cublasLtMatmulHeuristicResult_t results[16];
      int found = 0;
      ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, cl, cl, pref, 16, results, &found),
                CUBLAS_STATUS_SUCCESS);
      for (int i = 0; i < found; ++i) {
        uint32_t scheme = 0;
        int32_t splits = 1;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits),
                                             &written);
        const float alpha = 1.f, beta = 0.f;
        ASSERT_EQ(cublasLtMatmul(handle, desc, &alpha, dw.get(), a, dx.get(), b, &beta, y.get(), cl, y.get(), cl,
                                 &results[i].algo, ws.get(), ws_bytes, nullptr),
                  CUBLAS_STATUS_SUCCESS);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const double ratio = ErrorInRoundings<T>(y.Host(), ref);
        const bool fp32_reduction = splits <= 1 || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        std::printf(
            "[ precision] cuBLASLt bf16 m %4ld n %4ld k %4ld candidate %2d: split-K %2d, reduction %s: error "
            "%.2f roundings\n",
            static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), i, splits,
            splits <= 1                                        ? "none"
            : scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? "fp32"
            : scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE  ? "output type"
            : scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE      ? "in place"
                                                               : "other",
            ratio);
        if (fp32_reduction) {
          EXPECT_LT(ratio, 1.5) << "m=" << m << " n=" << n << " k=" << k << " candidate " << i;
          ++checked;
        }
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(a);
      cublasLtMatrixLayoutDestroy(b);
      cublasLtMatrixLayoutDestroy(cl);
      cublasLtMatmulDescDestroy(desc);
    }
  }
  EXPECT_GT(checked, 0);
  cublasLtDestroy(handle);
}

// Paged attention with sharp softmax (logits of std ~20): 4 query heads on 1 KV head of 128 (group 4), prefill
// chunks and decode rows, with and without the decode graph's plan.
struct SharpCase {
  const char* name;
  int32_t head_dim, heads, kv_heads;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (context, query rows)
  bool decode_graph = false;
};

template <typename T>
void AttentionIsAsExactAsOneRounding(const SharpCase& c) {
  const int32_t D = c.head_dim, bs = 16;
  std::mt19937 rng(D + c.heads);
  const int64_t kv_dim = int64_t{c.kv_heads} * D, q_stride = int64_t{c.heads + 2 * c.kv_heads} * D;
  std::vector<int32_t> qo_indptr = {0}, kv_indptr = {0}, last_len, pages;
  for (auto [ctx, q] : c.seqs) {
    const int32_t n = (ctx + bs - 1) / bs;
    qo_indptr.push_back(qo_indptr.back() + q);
    kv_indptr.push_back(kv_indptr.back() + n);
    last_len.push_back(ctx - (n - 1) * bs);
  }
  const int32_t num_blocks = kv_indptr.back();
  pages.resize(num_blocks);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  const int32_t Tq = qo_indptr.back();
  const float scale_qk = 0.2f * std::sqrt(512.f);  // x of std 1 through weights of std 0.2 over 512 inputs
  const std::vector<float> q = RandomIn<T>(Tq * q_stride, rng, scale_qk),
                           k = RandomIn<T>(int64_t{num_blocks} * bs * kv_dim, rng, scale_qk),
                           v = RandomIn<T>(int64_t{num_blocks} * bs * kv_dim, rng, scale_qk);
  Dev<T> dq(Convert<T>(q)), dk(Convert<T>(k)), dv(Convert<T>(v));
  Dev<int32_t> d_qo(qo_indptr), d_kv(kv_indptr), d_pages(pages), d_last(last_len);
  Dev<T> out(Tq * int64_t{c.heads} * D);
  void *fws, *iws, *iws_host;
  ASSERT_EQ(cudaMalloc(&fws, kernels::kAttentionFloatWorkspaceBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&iws, kernels::kAttentionIntWorkspaceBytes), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&iws_host, kernels::kAttentionIntWorkspaceBytes), cudaSuccess);
  kernels::AttentionPlan plan;
  const int32_t S = static_cast<int32_t>(c.seqs.size());
  ASSERT_EQ(kernels::PlanPagedAttention(fws, iws, iws_host, qo_indptr.data(), kv_indptr.data(), Tq, S, c.heads,
                                        c.kv_heads, D, bs, c.decode_graph, false, &plan, nullptr),
            cudaSuccess);
  const float sm_scale = 1.f / std::sqrt(float(D));
  ASSERT_EQ(kernels::RunPagedAttention<T>(plan, fws, iws, dq.get(), q_stride, dk.get(), dv.get(), d_qo.get(),
                                          d_kv.get(), d_pages.get(), d_last.get(), out.get(), S, c.heads, c.kv_heads, D,
                                          bs, sm_scale, 1.f, false, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> ref = testing::PagedAttentionReference(q, q_stride, k, v, c.seqs, qo_indptr, kv_indptr,
                                                                   pages, bs, c.heads, c.kv_heads, D, sm_scale);
  const double ratio = ErrorInRoundings<T>(out.Host(), ref);
  std::printf("[ precision] %s attention %s: error %.2f roundings\n", kName[std::is_same_v<T, __half>], c.name, ratio);
  // The probabilities go through the operand dtype before the product with V (as in every flash attention):
  // a few roundings, not tens.
  EXPECT_LT(ratio, 4.0) << c.name;
  cudaFree(fws);
  cudaFree(iws);
  cudaFreeHost(iws_host);
}

const SharpCase kSharpCases[] = {
    {"prefill 22, group 4, hd128", 128, 4, 1, {{22, 22}}},
    {"prefill 759 in a chunk after 200, group 4, hd128", 128, 4, 1, {{959, 759}}},
    {"decode at 30, 700, 3000, group 4, hd128", 128, 4, 1, {{30, 1}, {700, 1}, {3000, 1}}},
    {"decode graph plan at 30, 700, 3000, group 4, hd128", 128, 4, 1, {{30, 1}, {700, 1}, {3000, 1}}, true},
    {"decode at 3001 alone (split KV), group 4, hd128", 128, 4, 1, {{3001, 1}}},
    {"prefill 300 and decode, group 7, hd64", 64, 7, 1, {{300, 300}, {97, 1}}},
    {"prefill 97 and decode at 2000, group 8, hd256", 256, 8, 1, {{97, 97}, {2000, 1}}},
    {"decode at 1500, group 1, hd64", 64, 4, 4, {{1500, 1}, {7, 1}}},
};

TEST(Precision, Bf16AttentionIsAsExactAsAFewRoundings) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  for (const SharpCase& c : kSharpCases) AttentionIsAsExactAsOneRounding<__nv_bfloat16>(c);
}
TEST(Precision, Fp16AttentionIsAsExactAsAFewRoundings) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  for (const SharpCase& c : kSharpCases) AttentionIsAsExactAsOneRounding<__half>(c);
}

}  // namespace
}  // namespace inferd

// The fp8 kernels and the fp8 products against host references, on random data and odd sizes, outputs poisoned
// before each run.
// - Quantization (rows, weights at load) is exact: the same fp32 division and e4m3 rounding as the host's
//   cuda_fp8.h conversion, every byte and scale equal.
// - The fused norm and SiLU·mul quantizers: dequantized values within one e4m3 step (1/8 of the value, relative)
//   of the host's bf16-path value, since a bf16 rounding tie of the host's and the device's rsqrt may differ; the
//   mean error stays at half a step or less. The residual stream is updated exactly as the bf16 kernel does.
// - The products: an fp64 reference of the dequantized operands; fp32 accumulation (1e-5 of Σ|w·x| for the
//   streaming kernel, 1e-3 for cuBLASLt's fp8 tensor cores with fp32 promotion) plus one rounding of the output.
#include "kernels/fp8.h"

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda/gemm.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_gemm.h"
#include "kernels/gemv.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using kernels::Fp8;
using testing::Dev;
using testing::Random;

using testing::Deq;
using testing::QuantizeRow;

std::vector<__nv_bfloat16> Bf16(const std::vector<float>& v) {
  return testing::ToBf16(v);
}

TEST(Fp8, QuantizeRowsIsExact) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  // Rows of whole vectors of 8 up to 8,192 values (the one-pass kernel) and others (two passes).
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{7, 1000}, std::pair{3, 4097}, std::pair{130, 96},
                            std::pair{2, 8192}, std::pair{2, 8200}, std::pair{3, 8}}) {
    std::vector<float> v = Random(size_t(rows) * cols, rng, 3.f);
    v[0] = 0;  // a zero, and one row of zeros when there are several
    if (rows > 1) std::fill(v.begin() + cols, v.begin() + 2 * cols, 0.f);
    const std::vector<__nv_bfloat16> src = Bf16(v);
    const std::vector<float> rounded = testing::FromBf16(src);
    Dev<__nv_bfloat16> d(src);
    Dev<Fp8> q(size_t(rows) * cols);
    Dev<float> scales{size_t(rows)};
    CUDA_OK(kernels::QuantizeRowsFp8(d.get(), rows, cols, q.get(), scales.get(), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<Fp8> got = q.Host();
    const std::vector<float> got_scales = scales.Host();
    std::vector<Fp8> want(cols);
    int bad = 0;
    for (int r = 0; r < rows; ++r) {
      const float scale = QuantizeRow(rounded.data() + size_t(r) * cols, cols, want.data());
      EXPECT_EQ(got_scales[r], scale) << "row " << r << " of " << rows << "x" << cols;
      for (int c = 0; c < cols; ++c) bad += got[size_t(r) * cols + c].__x != want[c].__x;
    }
    EXPECT_EQ(bad, 0) << rows << "x" << cols;
  }
}

// Dequantized rows against their fp64 reference: each within one e4m3 step, the mean within half a step.
void ExpectNearQuantized(const std::vector<Fp8>& q, const std::vector<float>& scales, const std::vector<double>& ref,
                         int64_t rows, int64_t n) {
  double sum_rel = 0;
  int64_t counted = 0, bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const double want = ref[r * n + i], got = Deq(q[r * n + i]) * double{scales[r]};
      const double tol = 0.125 * std::abs(want) + scales[r] * std::ldexp(1.0, -9);  // one step, or subnormal
      if (!(std::abs(got - want) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "[" << r << ", " << i << "] = " << got << ", reference " << want;
      }
      if (std::abs(want) > scales[r] * 0.5) {  // normal e4m3 values
        sum_rel += std::abs(got - want) / std::abs(want);
        ++counted;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  ASSERT_GT(counted, 0);
  EXPECT_LT(sum_rel / counted, 0.0625) << "mean relative error over " << counted << " normal values";
}

TEST(Fp8, AddRmsNormQuantizesTheBf16Result) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(12);
  for (auto [rows, n] : {std::pair{1, 576}, std::pair{5, 4096}, std::pair{3, 8}, std::pair{2, 16384}}) {
    const std::vector<float> x0 = testing::FromBf16(Bf16(Random(size_t(rows) * n, rng)));
    const std::vector<float> delta = testing::FromBf16(Bf16(Random(size_t(rows) * n, rng)));
    const std::vector<float> weight = testing::FromBf16(Bf16(Random(n, rng, 0.5f)));
    Dev<__nv_bfloat16> dx(Bf16(x0)), dd(Bf16(delta)), dw(Bf16(weight));
    Dev<Fp8> q(size_t(rows) * n);
    Dev<float> scales{size_t(rows)};
    ASSERT_TRUE(kernels::AddRmsNormFp8Supports(dx.get(), dd.get(), dw.get(), n));
    CUDA_OK(kernels::AddRmsNormFp8(dx.get(), dd.get(), dw.get(), q.get(), scales.get(), rows, n, 1e-5f, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> ref(size_t(rows) * n);
    std::vector<float> residual(size_t(rows) * n);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) {
        const size_t at = size_t(r) * n + i;
        residual[at] = testing::Bf(x0[at] + delta[at]);
        ss += double{residual[at]} * residual[at];
      }
      const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int i = 0; i < n; ++i) {
        const size_t at = size_t(r) * n + i;
        ref[at] = testing::Bf(weight[i] * testing::Bf(static_cast<float>(residual[at] * inv)));
      }
    }
    EXPECT_EQ(testing::FromBf16(dx.Host()), residual) << "the residual stream, " << rows << "x" << n;
    ExpectNearQuantized(q.Host(), scales.Host(), ref, rows, n);
  }
}

TEST(Fp8, SiluMulQuantizesTheBf16Result) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(13);
  // One pass over rows of whole vectors of 8 up to 32,768 values, two passes over the others.
  for (auto [rows, inter] : {std::pair{1, 1536}, std::pair{9, 14336}, std::pair{4, 37}, std::pair{2, 32768},
                             std::pair{2, 32776}, std::pair{3, 8}}) {
    const std::vector<float> gu = testing::FromBf16(Bf16(Random(size_t(rows) * 2 * inter, rng, 2.f)));
    Dev<__nv_bfloat16> d(Bf16(gu));
    Dev<Fp8> q(size_t(rows) * inter);
    Dev<float> scales{size_t(rows)};
    CUDA_OK(
        kernels::ActivateMulFp8(d.get(), q.get(), scales.get(), rows, inter, kernels::GatedActivation::kSilu, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> ref(size_t(rows) * inter);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < inter; ++i) {
        const float g = gu[size_t(r) * 2 * inter + i], u = gu[size_t(r) * 2 * inter + inter + i];
        ref[size_t(r) * inter + i] = testing::Bf(testing::Bf(g / (1.f + std::exp(-g))) * u);
      }
    }
    ExpectNearQuantized(q.Host(), scales.Host(), ref, rows, inter);
    // The same rows one element off 16-byte alignment take the two-pass kernel: bit for bit the same result.
    std::vector<__nv_bfloat16> shifted = Bf16(gu);
    shifted.insert(shifted.begin(), __float2bfloat16(0.f));
    Dev<__nv_bfloat16> d2(shifted);
    Dev<Fp8> q2(size_t(rows) * inter);
    Dev<float> scales2{size_t(rows)};
    CUDA_OK(kernels::ActivateMulFp8(d2.get() + 1, q2.get(), scales2.get(), rows, inter, kernels::GatedActivation::kSilu,
                                    nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(scales2.Host(), scales.Host()) << rows << "x" << inter;
    const std::vector<Fp8> a = q.Host(), b = q2.Host();
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += a[i].__x != b[i].__x;
    EXPECT_EQ(differ, 0) << rows << "x" << inter;
  }
}

// Random weights quantized on the host (per row), with the fp64 product of their dequantized values.
struct Fp8Weights {
  std::vector<Fp8> q;
  std::vector<float> scale;
  Fp8Weights(int64_t n, int64_t k, std::mt19937& rng) : q(size_t(n) * k), scale(n) {
    const std::vector<float> w = testing::FromBf16(Bf16(Random(size_t(n) * k, rng, 0.05f)));
    for (int64_t r = 0; r < n; ++r) scale[r] = QuantizeRow(w.data() + r * k, k, q.data() + r * k);
  }
  double At(int64_t r, int64_t i, int64_t k) const { return Deq(q[r * k + i]) * double{scale[r]}; }
};

// (m, n, k, bias)
using Shape = std::tuple<int, int, int, bool>;

template <typename Out>
void ExpectProduct(const std::vector<Out>& y, const std::vector<double>& ref, const std::vector<double>& mag,
                   double acc_eps, const char* what) {
  const double out_eps = std::is_same_v<Out, float> ? 1e-7 : 8e-3;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double got;
    if constexpr (std::is_same_v<Out, float>) {
      got = y[i];
    } else {
      got = __bfloat162float(y[i]);
    }
    const double tol = acc_eps * mag[i] + out_eps * std::abs(ref[i]) + 1e-30;
    if (!(std::abs(got - ref[i]) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << what << " y[" << i << "] = " << got << ", reference " << ref[i] << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// The fp64 product y[r, c] = Σ x(r, i) · w(c, i) (+ bias[c]), and the sum of its terms' magnitudes.
struct Reference {
  std::vector<double> y, mag;
};
template <typename X, typename W>
Reference Product(int m, int n, int k, X x, W w, const std::vector<__nv_bfloat16>* bias) {
  Reference out{std::vector<double>(size_t(m) * n), std::vector<double>(size_t(m) * n)};
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double acc = bias ? __bfloat162float((*bias)[c]) : 0.0, a = std::abs(acc);
      for (int i = 0; i < k; ++i) {
        const double p = x(r, i) * w(c, i);
        acc += p;
        a += std::abs(p);
      }
      out.y[size_t(r) * n + c] = acc;
      out.mag[size_t(r) * n + c] = a;
    }
  }
  return out;
}

// X's values as T.
template <typename T>
std::vector<T> AsInput(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, __half>) {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = __float2half(v[i]);
    return out;
  } else {
    return Bf16(v);
  }
}
template <typename T>
double InputAt(const std::vector<T>& x, size_t i) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x[i]);
  } else {
    return __bfloat162float(x[i]);
  }
}

// The streaming product in both forms (CUDA cores, tensor cores) against the fp64 one; x_log2_range spreads X's
// magnitudes over 2^±range.
template <typename T, typename Out>
void CheckStreaming(const Shape& shape, uint32_t seed, int x_log2_range = 0) {
  const auto [m, n, k, with_bias] = shape;
  std::mt19937 rng(seed);
  const Fp8Weights w(n, k, rng);
  std::vector<float> xf = Random(size_t(m) * k, rng);
  std::uniform_int_distribution<int> exponent(-x_log2_range, x_log2_range);
  for (float& v : xf) v = std::ldexp(v, exponent(rng));
  const std::vector<T> x = AsInput<T>(xf);
  const std::vector<__nv_bfloat16> bias_bf16 = Bf16(Random(n, rng));
  const std::vector<T> bias = AsInput<T>(testing::FromBf16(bias_bf16));
  Dev<T> dx(x), db(bias);
  Dev<Fp8> dw(w.q);
  Dev<float> ds(w.scale);
  Dev<Out> dy(size_t(m) * n);
  ASSERT_TRUE(kernels::GemvFp8Supports(dx.get(), dw.get(), m, k));
  const Reference ref = Product(
      m, n, k, [&](int r, int i) { return InputAt(x, size_t(r) * k + i); }, [&](int c, int i) { return w.At(c, i, k); },
      with_bias ? &bias_bf16 : nullptr);
  for (auto form : {kernels::GemvForm::kCudaCores, kernels::GemvForm::kTensorCores}) {
    CUDA_OK((kernels::GemvFp8<T, Out>(dx.get(), dw.get(), ds.get(), with_bias ? db.get() : nullptr, dy.get(), m, n, k,
                                      nullptr, form)));
    CUDA_OK(cudaDeviceSynchronize());
    const char* what = form == kernels::GemvForm::kCudaCores ? "GemvFp8 on CUDA cores" : "GemvFp8 on tensor cores";
    ExpectProduct(dy.Host(), ref.y, ref.mag, 1e-5, what);
  }
}

class GemvFp8Test : public ::testing::TestWithParam<Shape> {};

TEST_P(GemvFp8Test, Bf16OutputMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckStreaming<__nv_bfloat16, __nv_bfloat16>(GetParam(), 21);
}
TEST_P(GemvFp8Test, Fp32OutputMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckStreaming<__nv_bfloat16, float>(GetParam(), 22);
}
// fp16 inputs go to the tensor cores as they are (bf16 ones are converted, kernels/gemv_tiles.cuh).
TEST_P(GemvFp8Test, Fp16InputMatchesReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckStreaming<__half, float>(GetParam(), 23);
}
// bf16 inputs of magnitudes from about 2^-20 to 2^19 (normal draws times 2^±17): the tensor-core form's f16 holds
// them (scaled by 1/16).
TEST_P(GemvFp8Test, WideRangeInputsMatchReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  CheckStreaming<__nv_bfloat16, float>(GetParam(), 24, 17);
}

// Every row count; k one lane sweep (16), between sweeps (528, 1040), past the unrolled loop (4112); n odd.
INSTANTIATE_TEST_SUITE_P(OddShapes, GemvFp8Test,
                         ::testing::Values(Shape{1, 37, 16, false}, Shape{2, 129, 528, true},
                                           Shape{3, 1001, 1040, false}, Shape{4, 67, 4112, true},
                                           Shape{5, 250, 2064, false}, Shape{6, 33, 1056, true},
                                           Shape{7, 513, 528, false}, Shape{8, 130, 4096, true},
                                           Shape{8, 3, 14336, false}, Shape{1, 4096, 4096, true}));

// The fp8 product of many rows through the backend's wrapper: per-token input scales and per-channel weight scales
// in the epilogue, then the bias; CUTLASS's kernel (kernels/fp8_gemm.h, where the GPU runs it) and cuBLASLt's. Row
// counts past the streaming kernel's, on both sides of the CUTLASS tile choice by the rows (128), every tile.
class Fp8GemmTest : public ::testing::TestWithParam<Shape> {};

TEST_P(Fp8GemmTest, MatchesTheDequantizedReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const auto [m, n, k, with_bias] = GetParam();
  std::mt19937 rng(31 + m);
  const Fp8Weights w(n, k, rng);
  std::vector<Fp8> xq(size_t(m) * k);
  std::vector<float> xs(m);
  {
    std::vector<float> x = testing::FromBf16(Bf16(Random(size_t(m) * k, rng, 2.f)));
    for (int r = 0; r < m; ++r) xs[r] = QuantizeRow(x.data() + size_t(r) * k, k, xq.data() + size_t(r) * k);
  }
  const std::vector<__nv_bfloat16> bias = Bf16(Random(n, rng));
  Dev<Fp8> dxq(xq), dwq(w.q);
  Dev<float> dxs(xs), dws(w.scale);
  Dev<__nv_bfloat16> db(bias), dy(size_t(m) * n);
  const Reference ref = Product(
      m, n, k, [&](int r, int i) { return Deq(xq[size_t(r) * k + i]) * double{xs[r]}; },
      [&](int c, int i) { return w.At(c, i, k); }, with_bias ? &bias : nullptr);
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  for (const bool cutlass : {true, false}) {
    int64_t ws_bytes = 0;
    auto gemm = cuda::Gemm::Create(CUDA_R_16BF, int64_t{32} << 20, &ws_bytes);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    (*gemm)->set_fp8_cutlass(cutlass);
    CUDA_OK(cudaMemset(dy.get(), 0xff, size_t(m) * n * 2));  // NaNs: a product that writes nothing fails
    const absl::Status st = (*gemm)->Run(cuda::Operand(dxq.get(), dxs.get()), cuda::Operand(dwq.get(), dws.get()),
                                         dy.get(), m, n, k, with_bias ? db.get() : nullptr, false, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    const bool ran_cutlass = cutlass && kernels::Fp8ScaledGemmAvailable(device) &&
                             kernels::Fp8ScaledGemmSupports(dxq.get(), dwq.get(), dy.get(), db.get(), n, k);
    ExpectProduct(dy.Host(), ref.y, ref.mag, 1e-3, ran_cutlass ? "CUTLASS fp8" : "cuBLASLt fp8");
    if (!ran_cutlass) continue;
    // The tile Tune measures fastest for the shape, through Run again.
    const std::vector<cuda::Operand> weights = {cuda::Operand(dwq.get(), dws.get())};
    auto tuned = (*gemm)->Tune(cuda::Operand(dxq.get(), dxs.get()), weights, dy.get(), m, n, k,
                               with_bias ? db.get() : nullptr, false, nullptr);
    ASSERT_TRUE(tuned.ok()) << tuned.status();
    ASSERT_EQ((*gemm)->cutlass_tiles().size(), 1u);
    CUDA_OK(cudaMemset(dy.get(), 0xff, size_t(m) * n * 2));
    ASSERT_TRUE((*gemm)
                    ->Run(cuda::Operand(dxq.get(), dxs.get()), cuda::Operand(dwq.get(), dws.get()), dy.get(), m, n, k,
                          with_bias ? db.get() : nullptr, false, nullptr)
                    .ok());
    CUDA_OK(cudaDeviceSynchronize());
    ExpectProduct(
        dy.Host(), ref.y, ref.mag, 1e-3,
        absl::StrCat("CUTLASS fp8, tuned tile ", kernels::Fp8GemmTileName((*gemm)->cutlass_tile(m, n, k))).c_str());
  }
  // Every tile, called directly.
  if (!kernels::Fp8ScaledGemmAvailable(device)) return;
  for (const kernels::Fp8GemmTile tile : kernels::kFp8GemmTiles) {
    CUDA_OK(cudaMemset(dy.get(), 0xff, size_t(m) * n * 2));
    CUDA_OK(kernels::Fp8ScaledGemm(dxq.get(), dxs.get(), dwq.get(), dws.get(), with_bias ? db.get() : nullptr, dy.get(),
                                   m, n, k, nullptr, tile));
    CUDA_OK(cudaDeviceSynchronize());
    ExpectProduct(dy.Host(), ref.y, ref.mag, 1e-3,
                  absl::StrCat("CUTLASS fp8 tile ", kernels::Fp8GemmTileName(tile)).c_str());
  }
}

// k and n multiples of 16 (cuBLASLt's fp8 kernels need 16-byte aligned columns: the backend refuses fp8 for
// models without); m odd, n not a multiple of a tile.
INSTANTIATE_TEST_SUITE_P(OddShapes, Fp8GemmTest,
                         ::testing::Values(Shape{5, 96, 64, false}, Shape{17, 1008, 1040, true},
                                           Shape{300, 240, 2064, false}, Shape{64, 2064, 4096, true},
                                           Shape{128, 512, 1024, true}, Shape{129, 256, 528, true},
                                           Shape{1000, 1040, 2048, true}, Shape{9, 4096, 14336, false}));

// Per-tensor scales on both sides (cuBLASLt's scalar scaling): the scale vectors' first entries scale every row.
TEST(Fp8, PerTensorScaledProductMatchesTheReference) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const int m = 33, n = 256, k = 528;
  std::mt19937 rng(51);
  const Fp8Weights w(n, k, rng);
  std::vector<Fp8> xq(size_t(m) * k);
  std::vector<float> xs(m);
  const std::vector<float> x = testing::FromBf16(Bf16(Random(size_t(m) * k, rng)));
  for (int r = 0; r < m; ++r) xs[r] = QuantizeRow(x.data() + size_t(r) * k, k, xq.data() + size_t(r) * k);
  Dev<Fp8> dxq(xq), dwq(w.q);
  Dev<float> dxs(xs), dws(w.scale);
  Dev<__nv_bfloat16> dy(size_t(m) * n);
  int64_t ws_bytes = 0;
  auto gemm = cuda::Gemm::Create(CUDA_R_16BF, int64_t{32} << 20, &ws_bytes);
  ASSERT_TRUE(gemm.ok());
  const absl::Status st =
      (*gemm)->Run(cuda::Operand(dxq.get(), dxs.get(), true), cuda::Operand(dwq.get(), dws.get(), true), dy.get(), m, n,
                   k, nullptr, false, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_OK(cudaDeviceSynchronize());
  const Reference ref = Product(
      m, n, k, [&](int r, int i) { return Deq(xq[size_t(r) * k + i]) * double{xs[0]}; },
      [&](int c, int i) { return Deq(w.q[size_t(c) * k + i]) * double{w.scale[0]}; }, nullptr);
  ExpectProduct(dy.Host(), ref.y, ref.mag, 1e-3, "cuBLASLt fp8 per-tensor");
  // Mixed (per-row on one side, per-tensor on the other) is refused, not run.
  EXPECT_FALSE((*gemm)
                   ->Run(cuda::Operand(dxq.get(), dxs.get(), true), cuda::Operand(dwq.get(), dws.get()), dy.get(), m, n,
                         k, nullptr, false, nullptr)
                   .ok());
}

TEST(Fp8, RefusesShapesItCannotRun) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  Dev<__nv_bfloat16> x(size_t{64});
  Dev<Fp8> w(size_t{64});
  Dev<float> s(size_t{4}), y(size_t{64});
  EXPECT_FALSE(kernels::GemvFp8Supports(x.get(), w.get(), 1, 8));  // k not a multiple of 16
  EXPECT_FALSE(kernels::GemvFp8Supports(x.get(), w.get(), kernels::kGemvMaxRows + 1, 16));
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(x.get(), nullptr, x.get(), 12));
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(x.get(), nullptr, x.get(), 16392));
  EXPECT_EQ((kernels::GemvFp8<__nv_bfloat16, float>(x.get(), w.get(), s.get(), nullptr, y.get(), 1, 4, 8, nullptr)),
            cudaErrorInvalidValue);
  int64_t ws = 0;
  auto gemm = cuda::Gemm::Create(CUDA_R_16BF, int64_t{1} << 20, &ws);
  ASSERT_TRUE(gemm.ok());
  // fp8 weights with an unquantized input of more rows than the streaming kernel takes: an error, not a launch.
  EXPECT_FALSE((*gemm)->Run(x.get(), cuda::Operand(w.get(), s.get()), y.get(), 16, 4, 16, nullptr, true, nullptr).ok());
}

}  // namespace
}  // namespace inferd

// RMSNorm kernels against a CPU reference on random data and odd sizes. Skips without a GPU.
#include "kernels/rms_norm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace inferd {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<float> Reference(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t n,
                             float eps) {
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = static_cast<float>(w[i] * (x[r * n + i] * inv));
  }
  return out;
}

class RmsNormTest : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(RmsNormTest, F32MatchesReferenceWithin1e5Relative) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [rows, n] = GetParam();
  std::mt19937 rng(rows * 1000 + n);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> x(rows * n), w(n);
  for (auto& v : x) v = dist(rng);
  for (auto& v : w) v = 1.f + 0.1f * dist(rng);
  float *dx, *dw, *dout;
  CUDA_OK(cudaMalloc(&dx, x.size() * 4));
  CUDA_OK(cudaMalloc(&dw, w.size() * 4));
  CUDA_OK(cudaMalloc(&dout, x.size() * 4));
  CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(kernels::RmsNormF32(dx, dw, dout, rows, n, 1e-5f, nullptr));
  std::vector<float> out(x.size());
  CUDA_OK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
  const std::vector<float> ref = Reference(x, w, rows, n, 1e-5f);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << i;
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
}

TEST_P(RmsNormTest, Bf16MatchesReferenceWithinBf16Rounding) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [rows, n] = GetParam();
  std::mt19937 rng(rows * 7 + n);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<__nv_bfloat16> x(rows * n), w(n);
  std::vector<float> xf(rows * n), wf(n);
  for (size_t i = 0; i < x.size(); ++i) xf[i] = __bfloat162float(x[i] = __float2bfloat16(dist(rng)));
  for (size_t i = 0; i < w.size(); ++i) wf[i] = __bfloat162float(w[i] = __float2bfloat16(1.f + 0.1f * dist(rng)));
  __nv_bfloat16 *dx, *dw, *dout;
  CUDA_OK(cudaMalloc(&dx, x.size() * 2));
  CUDA_OK(cudaMalloc(&dw, w.size() * 2));
  CUDA_OK(cudaMalloc(&dout, x.size() * 2));
  CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(kernels::RmsNormBf16(dx, dw, dout, rows, n, 1e-5f, nullptr));
  std::vector<__nv_bfloat16> out(x.size());
  CUDA_OK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
  const std::vector<float> ref = Reference(xf, wf, rows, n, 1e-5f);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(__bfloat162float(out[i]), ref[i], 8e-3 * (1 + std::abs(ref[i]))) << i;  // bf16: 8 mantissa bits
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
}

INSTANTIATE_TEST_SUITE_P(OddSizes, RmsNormTest,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(3, 17), std::make_pair(17, 97),
                                           std::make_pair(5, 576), std::make_pair(2, 4096), std::make_pair(33, 5000)));

}  // namespace
}  // namespace inferd

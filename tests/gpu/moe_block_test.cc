// A whole mixture-of-experts block on the device, from the router's logits to the layer's output, composed of the
// kernels the cuda backend's kMoe will run: MoeRoute, MoeGather, MoeExpertGemv (gate/up), ActivateMul (SiLU·mul),
// MoeExpertGemv (down), MoeCombine; against the same arithmetic on the CPU (the cpu backend's routing, products in
// fp32 rounded to bf16 where the device rounds); and the few-row path (MoeTopK, MoeRowGatedGemv,
// MoeRowDownCombine) against the grouped one, bit for bit. Mixtral's 8 experts / top 2 renormalised and Qwen3-MoE's
// 128 / top 8 not, over a decode step's rows.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "engine/model/moe_routing.h"
#include "kernels/elementwise.h"
#include "kernels/moe_products.h"
#include "kernels/moe_routing.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::Bf;
using testing::HaveGpu;
namespace k = kernels;

template <typename T>
T* Upload(const std::vector<T>& v) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T) + 16), cudaSuccess);
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}
template <typename T>
T* Scratch(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T) + 16), cudaSuccess);
  cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T));
  return static_cast<T*>(p);
}

void RunBlock(int64_t rows, int32_t experts, int32_t topk, bool normalize, int64_t hidden, int64_t inter) {
  std::mt19937 rng(static_cast<uint32_t>(rows * 7 + experts));
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(rows * hidden), logits(rows * experts), gate_up(int64_t{experts} * 2 * inter * hidden),
      down(int64_t{experts} * hidden * inter);
  for (float& v : x) v = Bf(d(rng));
  for (float& v : logits) v = 2.f * d(rng);
  for (float& v : gate_up) v = Bf(0.1f * d(rng));
  for (float& v : down) v = Bf(0.1f * d(rng));
  // The CPU: the cpu backend's routing, each chosen expert's SiLU-gated MLP with the device's bf16 roundings.
  std::vector<float> want(rows * hidden, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> p(logits.begin() + r * experts, logits.begin() + (r + 1) * experts);
    std::vector<int32_t> order, ids(topk);
    std::vector<float> route(topk);
    RouteRow(p.data(), experts, topk, normalize, order, ids.data(), route.data());
    std::vector<double> acc(hidden, 0.0);
    for (int32_t j = 0; j < topk; ++j) {
      const int64_t e = ids[j];
      const float weight = route[j];
      std::vector<float> act(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < hidden; ++c) {
          g += double(gate_up[(e * 2 * inter + i) * hidden + c]) * x[r * hidden + c];
          u += double(gate_up[(e * 2 * inter + inter + i) * hidden + c]) * x[r * hidden + c];
        }
        const float gb = Bf(float(g)), ub = Bf(float(u));
        act[i] = Bf(Bf(gb / (1.f + std::exp(-gb))) * ub);
      }
      for (int64_t c = 0; c < hidden; ++c) {
        double y = 0;
        for (int64_t i = 0; i < inter; ++i) y += double(down[(e * hidden + c) * inter + i]) * act[i];
        acc[c] += weight * Bf(float(y));
      }
    }
    for (int64_t c = 0; c < hidden; ++c) want[r * hidden + c] = Bf(float(acc[c]));
  }
  // The device, kernel by kernel on one stream.
  const int64_t slots = rows * topk;
  __nv_bfloat16* dx = Upload(testing::ToBf16(x));
  float* dlogits = Upload(logits);
  __nv_bfloat16* dgu = Upload(testing::ToBf16(gate_up));
  __nv_bfloat16* ddown = Upload(testing::ToBf16(down));
  int32_t* ids = Scratch<int32_t>(slots);
  float* weights = Scratch<float>(slots);
  int32_t* counts = Scratch<int32_t>(experts);
  int32_t* offsets = Scratch<int32_t>(experts + 1);
  int32_t* sorted = Scratch<int32_t>(slots);
  int32_t* positions = Scratch<int32_t>(slots);
  __nv_bfloat16* xs = Scratch<__nv_bfloat16>(slots * hidden);
  __nv_bfloat16* gus = Scratch<__nv_bfloat16>(slots * 2 * inter);
  __nv_bfloat16* acts = Scratch<__nv_bfloat16>(slots * inter);
  __nv_bfloat16* ys = Scratch<__nv_bfloat16>(slots * hidden);
  __nv_bfloat16* out = Scratch<__nv_bfloat16>(rows * hidden);
  ASSERT_EQ(
      k::MoeRoute(dlogits, rows, experts, topk, normalize, ids, weights, counts, offsets, sorted, positions, nullptr),
      cudaSuccess);
  ASSERT_EQ(k::MoeGather(dx, sorted, slots, topk, hidden, xs, nullptr), cudaSuccess);
  ASSERT_EQ(k::MoeExpertGemv(xs, dgu, offsets, experts, gus, 2 * inter, hidden, nullptr), cudaSuccess);
  ASSERT_EQ(k::ActivateMul(gus, acts, slots, inter, k::GatedActivation::kSilu, nullptr), cudaSuccess);
  ASSERT_EQ(k::MoeExpertGemv(acts, ddown, offsets, experts, ys, hidden, inter, nullptr), cudaSuccess);
  ASSERT_EQ(k::MoeCombine(ys, positions, weights, rows, topk, hidden, out, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<__nv_bfloat16> got(rows * hidden);
  cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost);
  // The products' fp32 sums run in another order, so a bf16 rounding of an intermediate may land one ulp apart:
  // a few ulps of the output's scale.
  double scale = 0, worst = 0;
  for (float v : want) scale = std::max(scale, double(std::abs(v)));
  for (int64_t i = 0; i < rows * hidden; ++i) {
    worst = std::max(worst, std::abs(double(__bfloat162float(got[i])) - want[i]));
  }
  EXPECT_LT(worst, 4.0 / 128 * scale) << rows << " rows, " << experts << " experts, top " << topk << ": worst " << worst
                                      << " against outputs up to " << scale;
  EXPECT_GT(scale, 0.0);
  // The few-row path (MoeTopK, MoeRowGatedGemv, MoeRowDownCombine: no grouping, gather or combine of its own) sums
  // in the same order: bit for bit the grouped path's output.
  __nv_bfloat16* row_out = Scratch<__nv_bfloat16>(rows * hidden);
  ASSERT_EQ(k::MoeTopK(dlogits, rows, experts, topk, normalize, ids, weights, nullptr), cudaSuccess);
  ASSERT_EQ(k::MoeRowGatedGemv(dx, dgu, ids, rows, topk, acts, inter, hidden, k::GatedActivation::kSilu, nullptr),
            cudaSuccess);
  ASSERT_EQ(k::MoeRowDownCombine(acts, ddown, ids, weights, rows, topk, row_out, hidden, inter, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<__nv_bfloat16> by_row(rows * hidden);
  cudaMemcpy(by_row.data(), row_out, by_row.size() * 2, cudaMemcpyDeviceToHost);
  int64_t differ = 0;
  for (int64_t i = 0; i < rows * hidden; ++i) differ += std::memcmp(&by_row[i], &got[i], 2) != 0;
  EXPECT_EQ(differ, 0) << rows << " rows, " << experts << " experts, top " << topk
                       << ": the few-row path against the grouped one";
  cudaFree(row_out);
  for (void* p : std::initializer_list<void*>{dx, dlogits, dgu, ddown, ids, weights, counts, offsets, sorted, positions,
                                              xs, gus, acts, ys, out}) {
    cudaFree(p);
  }
}

TEST(MoeBlock, TheDevicesKernelsComposeToTheCpuArithmetic) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  RunBlock(/*rows=*/1, /*experts=*/8, /*topk=*/2, /*normalize=*/true, /*hidden=*/256, /*inter=*/96);
  RunBlock(5, 8, 2, true, 256, 96);
  RunBlock(4, 128, 8, false, 128, 32);
  RunBlock(37, 16, 4, true, 64, 40);
  RunBlock(3, 16, 4, true, 2056, 200);  // rows of 257 16-byte chunks: several batches of loads and a partial one
}

}  // namespace
}  // namespace inferd

// The experts' products (kernels::MoeExpertGemv, MoeExpertGemm, MoeGroupedGemm) against fp32 products on the CPU: every
// expert's run of rows times its own weights, runs of 0 (experts no row chose), 1, 2, 3 and more than a pass takes
// (13), widths no tile divides, bf16 and fp16, and the runs' bounds read from the device.
#include "kernels/moe_products.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/moe_grouped_gemm.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::FromFloatHost;
using testing::HaveGpu;
using testing::ToFloatHost;
namespace k = kernels;

// The kernel under test: MoeExpertGemv (a decode step's streaming passes), MoeExpertGemm (the tensor cores' tiles
// for long runs) or MoeGroupedGemm (CUTLASS's grouped GEMM, Hopper).
enum class Kernel { kGemv, kTiles, kGrouped };

// short_runs: the grouped GEMM told the step's slots (its tiles then chosen by the runs' average length; else
// prefill's).
template <typename T>
void Check(const std::vector<int32_t>& counts, int64_t n, int64_t kdim, Kernel kernel = Kernel::kGemv,
           bool short_runs = false) {
  const bool gemm = kernel != Kernel::kGemv;
  const int32_t experts = static_cast<int32_t>(counts.size());
  std::vector<int32_t> offsets(experts + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t slots = offsets.back();
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + kdim + slots));
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<T> x(slots * kdim), w(int64_t{experts} * n * kdim);
  for (T& v : x) v = FromFloatHost<T>(d(rng));
  for (T& v : w) v = FromFloatHost<T>(0.1f * d(rng));
  void *dx = nullptr, *dw = nullptr, *dy = nullptr, *doff = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.size() * 2 + 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, slots * n * 2 + 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&doff, offsets.size() * 4), cudaSuccess);
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(doff, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice);
  const auto* xs = static_cast<const T*>(dx);
  const auto* ws = static_cast<const T*>(dw);
  const auto* offs = static_cast<const int32_t*>(doff);
  if (kernel == Kernel::kGrouped) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const size_t scratch_bytes = k::MoeGroupedGemmWorkspaceBytes(experts, sms);
    void* scratch = nullptr;
    ASSERT_EQ(cudaMalloc(&scratch, scratch_bytes), cudaSuccess);
    for (int call = 0; call < 2; ++call) {  // the groups are rebuilt on the device each call
      ASSERT_EQ(k::MoeGroupedGemm<T>(xs, ws, offs, experts, static_cast<T*>(dy), n, kdim, scratch, scratch_bytes, sms,
                                     nullptr, short_runs ? slots : 0),
                cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(scratch);
  } else {
    ASSERT_EQ(gemm ? k::MoeExpertGemm<T>(xs, ws, offs, experts, std::max<int64_t>(slots, 1), static_cast<T*>(dy), n,
                                         kdim, nullptr)
                   : k::MoeExpertGemv<T>(xs, ws, offs, experts, static_cast<T*>(dy), n, kdim, nullptr),
              cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> y(slots * n);
  cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost);
  // Within about one rounding of the output: fp32 sums in another order, rounded once to T.
  const double ulp = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;
  int64_t wrong = 0;
  std::string first;
  for (int32_t e = 0; e < experts; ++e) {
    for (int32_t s = offsets[e]; s < offsets[e + 1]; ++s) {
      for (int64_t c = 0; c < n; ++c) {
        double want = 0;
        for (int64_t i = 0; i < kdim; ++i) {
          want += double(ToFloatHost(x[s * kdim + i])) * ToFloatHost(w[(e * n + c) * kdim + i]);
        }
        const double got = ToFloatHost(y[s * n + c]);
        if (std::abs(got - want) > ulp * std::abs(want) + 1e-3) {
          if (wrong++ == 0)
            first = "expert " + std::to_string(e) + " slot " + std::to_string(s) + " column " + std::to_string(c) +
                    ": " + std::to_string(got) + " against " + std::to_string(want);
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << (kernel == Kernel::kGrouped ? "grouped "
                          : gemm                     ? "gemm "
                                                     : "gemv ")
                      << slots << " slots, n " << n << ", k " << kdim << ": " << first;
  for (void* p : {dx, dw, dy, doff}) cudaFree(p);
}

TEST(MoeExpertGemv, EachExpertsRunTimesItsOwnWeights) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  // A decode step's few slots; an expert no row chose; a run longer than one pass (13 rows: passes of 8 and 5).
  const std::vector<int32_t> counts = {0, 1, 2, 13, 0, 3, 8, 1};
  for (auto [n, kdim] : {std::pair<int64_t, int64_t>{96, 64}, {37, 520}, {512, 1024}, {1, 8}}) {
    Check<__nv_bfloat16>(counts, n, kdim);
    Check<__half>(counts, n, kdim);
  }
  Check<__nv_bfloat16>({2}, 64, 64);                           // one expert
  Check<__nv_bfloat16>(std::vector<int32_t>(128, 0), 64, 64);  // no slots at all: nothing read or written
}

// A prefill's long runs through the tensor cores' tiles: runs of 0, 1, a tile (64), a tile and a row, more than two
// tiles; widths no tile divides (37, 200) and k of one step (32) to many.
TEST(MoeExpertGemm, EachExpertsLongRunTimesItsOwnWeights) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const std::vector<int32_t> counts = {0, 1, 64, 65, 0, 130, 7, 200};
  for (auto [n, kdim] : {std::pair<int64_t, int64_t>{96, 64}, {37, 544}, {512, 1024}, {200, 32}}) {
    Check<__nv_bfloat16>(counts, n, kdim, Kernel::kTiles);
    Check<__half>(counts, n, kdim, Kernel::kTiles);
  }
  Check<__nv_bfloat16>(std::vector<int32_t>(128, 0), 64, 64, Kernel::kTiles);  // no slots: every block returns
  alignas(16) static __nv_bfloat16 host[64];
  EXPECT_EQ(k::MoeExpertGemm<__nv_bfloat16>(host, host, nullptr, 2, 8, nullptr, 8, 48, nullptr), cudaErrorInvalidValue)
      << "k not a multiple of 32";
}

// The same long runs through CUTLASS's grouped GEMM, where the GPU has it (sm_90a): runs of 0, 1, a tile (128) and
// a row, many tiles; widths of a tile and not (96, 200), k of one step (64) to many, and no slots at all; both
// tilings of kernels/moe_grouped_gemm.cu (slots 0 and 629 slots, 78 rows an expert: the wide tiles stored by TMA; a
// decode step's 28 slots, 3.5 an expert: the narrow ones stored from registers).
TEST(MoeGroupedGemm, EachExpertsLongRunTimesItsOwnWeights) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  if (!k::MoeGroupedGemmAvailable(0)) GTEST_SKIP() << "not a Hopper GPU (sm_90a)";
  const std::vector<int32_t> counts = {0, 1, 128, 129, 0, 300, 7, 64};  // 629 slots: under 128 an expert
  const std::vector<int32_t> few = {0, 1, 2, 13, 0, 3, 8, 1};           // 28 slots: under 32 an expert
  for (auto [n, kdim] : {std::pair<int64_t, int64_t>{96, 64}, {200, 72}, {512, 1024}, {768, 2048}}) {
    for (bool short_runs : {false, true}) {
      Check<__nv_bfloat16>(counts, n, kdim, Kernel::kGrouped, short_runs);
      Check<__half>(counts, n, kdim, Kernel::kGrouped, short_runs);
    }
    Check<__nv_bfloat16>(few, n, kdim, Kernel::kGrouped, /*short_runs=*/true);
    Check<__half>(few, n, kdim, Kernel::kGrouped, /*short_runs=*/true);
  }
  Check<__nv_bfloat16>(std::vector<int32_t>(128, 0), 64, 64, Kernel::kGrouped);
  alignas(16) static __nv_bfloat16 host[64];
  EXPECT_EQ(k::MoeGroupedGemm<__nv_bfloat16>(host, host, nullptr, 2, host, 12, 64, nullptr, 0, 132, nullptr),
            cudaErrorInvalidValue)
      << "n not a multiple of 8";
}

TEST(MoeExpertGemv, ShapesItCannotTakeAreRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  alignas(16) static __nv_bfloat16 host[16];
  const auto* p = host;
  EXPECT_EQ(k::MoeExpertGemv<__nv_bfloat16>(p, p, nullptr, 0, nullptr, 8, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k::MoeExpertGemv<__nv_bfloat16>(p, p, nullptr, 2, nullptr, 8, 12, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k::MoeExpertGemv<__nv_bfloat16>(p + 1, p, nullptr, 2, nullptr, 8, 8, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace inferd

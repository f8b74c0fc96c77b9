// The ceiling kernels against CPU references (odd sizes, random data), the run timer, the ceilings'
// measurement, and NVML's readings of the device. Skip without a GPU.
#include "engine/backends/cuda/ceilings.h"

#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/nvml.h"
#include "engine/backends/cuda/run_timer.h"
#include "kernels/ceilings.h"
#include "tests/gpu/gpu_test_util.h"

namespace inferd {
namespace {

using testing::Bf;
using testing::Dev;

TEST(Ceilings, FillUniformWritesTheHashOfEachIndexRoundedTo16Bits) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const int64_t n = 100003;
  Dev<__nv_bfloat16> b(n);
  Dev<__half> h(n);
  CUDA_OK(kernels::FillUniform16(b.get(), n, true, 11, nullptr));
  CUDA_OK(kernels::FillUniform16(h.get(), n, false, 11, nullptr));
  const std::vector<__nv_bfloat16> got_b = b.Host();
  const std::vector<__half> got_h = h.Host();
  double mean = 0, lo = 1, hi = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float want = kernels::UniformAt(11, i);
    ASSERT_EQ(__bfloat162float(got_b[i]), Bf(want)) << i;
    ASSERT_EQ(__half2float(got_h[i]), __half2float(__float2half(want))) << i;
    mean += want / n;
    lo = std::min<double>(lo, want);
    hi = std::max<double>(hi, want);
  }
  EXPECT_NEAR(mean, 0.0, 0.01);  // uniform in [-1, 1): mean 0, standard error 0.0018
  EXPECT_GE(lo, -1.0);
  EXPECT_LT(lo, -0.99);
  EXPECT_LT(hi, 1.0);
  EXPECT_GT(hi, 0.99);
  EXPECT_NE(kernels::UniformAt(11, 5), kernels::UniformAt(12, 5));
}

TEST(Ceilings, ReadReduceSumsEveryLane) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int64_t n4 = 12347;  // odd: the tail loop runs
  std::vector<float> host(n4 * 4);
  double want = 0;
  for (float& x : host) want += (x = u(rng));
  Dev<float> data(host), out(std::vector<float>{0.f});
  CUDA_OK(kernels::ReadReduce(reinterpret_cast<const float4*>(data.get()), n4, out.get(), 3, nullptr));
  EXPECT_NEAR(out.Host()[0], want, want * 1e-5);
}

TEST(RunTimer, TimesEachRunAndLongerWorkTakesLonger) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const int64_t n = int64_t{64} << 20;
  Dev<float> data(std::vector<float>(n, 0.5f)), out(std::vector<float>{0.f});
  int64_t elements = n;
  const auto run = [&] {
    return cuda::FromCuda(
        kernels::ReadReduce(reinterpret_cast<const float4*>(data.get()), elements / 4, out.get(), 132, nullptr),
        "ReadReduce");
  };
  auto full = cuda::TimeRuns(run, 7, nullptr);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->size(), 7u);
  for (float ms : *full) EXPECT_GT(ms, 0.f);
  elements = n / 8;
  auto eighth = cuda::TimeRuns(run, 7, nullptr);
  ASSERT_TRUE(eighth.ok()) << eighth.status();
  EXPECT_LT(cuda::Median(*eighth), cuda::Median(*full) / 2);  // an eighth of the bytes, well under half the time
}

TEST(RunTimer, StopsAtTheFirstFailingRunAndReturnsItsStatus) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  int calls = 0;
  auto r = cuda::TimeRuns([&] { return ++calls == 3 ? absl::ResourceExhaustedError("third run") : absl::OkStatus(); },
                          10, nullptr);
  EXPECT_EQ(r.status(), absl::ResourceExhaustedError("third run"));
  EXPECT_EQ(calls, 3);
}

TEST(RunTimer, MedianIsTheMiddleOfAnOddCountAndTheUpperMiddleOfAnEvenOne) {
  EXPECT_EQ(cuda::Median({5.f, 1.f, 3.f}), 3.f);
  EXPECT_EQ(cuda::Median({4.f, 1.f, 3.f, 2.f}), 3.f);
  EXPECT_EQ(cuda::Median({2.5f}), 2.5f);
}

TEST(Ceilings, MeasuredRatesArePositiveAndBelowWhatAnyGpuCanDo) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  auto read = cuda::MeasureReadBandwidth(int64_t{256} << 20, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_GT(*read, 1e11);  // 100 GB/s
  EXPECT_LT(*read, 2e13);  // 20 TB/s
  int64_t ws = 0;
  auto gemm = cuda::Gemm::Create(CUDA_R_16BF, &ws);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  auto rate = cuda::MeasureGemmRate(**gemm, true, 2048, nullptr);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GT(*rate, 1e12);  // 1 TFLOP/s
  EXPECT_LT(*rate, 5e15);  // 5 PFLOP/s
}

TEST(Ceilings, NvmlReadsTheDeviceAndItsEnergyCounterAdvances) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::unique_ptr<cuda::Nvml> nvml = cuda::Nvml::Open(0);
  ASSERT_NE(nvml, nullptr) << "NVML did not open on a machine with a GPU";
  const DeviceReading a = nvml->Read();
  ASSERT_TRUE(a.power_w && a.temperature_c && a.sm_clock_hz && a.memory_used_bytes && a.utilization && a.energy_j);
  EXPECT_GT(*a.power_w, 5);
  EXPECT_LT(*a.power_w, 2000);
  EXPECT_GT(*a.temperature_c, 0);
  EXPECT_LT(*a.temperature_c, 110);
  EXPECT_GT(*a.sm_clock_hz, 1e8);
  EXPECT_GT(*a.memory_used_bytes, 0);
  EXPECT_GE(*a.utilization, 0);
  EXPECT_LE(*a.utilization, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const DeviceReading b = nvml->Read();
  ASSERT_TRUE(b.energy_j);
  // An idle GPU still draws tens of watts: half a second is joules, not nothing.
  EXPECT_GT(*b.energy_j - *a.energy_j, 1.0);
}

}  // namespace
}  // namespace inferd

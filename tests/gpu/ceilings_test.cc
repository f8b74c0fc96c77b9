// The ceiling kernels against CPU references (odd sizes, random data), the run timer, the ceilings'
// measurement, and NVML's readings of the device. Skip without a GPU.
#include "engine/backends/cuda/ceilings.h"

#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/nvml.h"
#include "engine/backends/cuda/run_timer.h"
#include "engine/runtime/device_layout.h"
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

// The device's peaks from its attributes: DRAM bandwidth = 2 (double data rate) x memory clock x bus width, and on
// sm_90 (H100, H200) dense bf16 tensor throughput = SMs x boost clock x 4096 FLOP per clock per SM. A measurement
// above its peak counts bytes or FLOPs it did not move; one far below it times something else (a cold clock, a
// launch, the host).
TEST(Ceilings, MeasuredRatesLieBetweenHalfAndAllOfTheDevicesPeak) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  int mem_khz = 0, bus_bits = 0, sm_khz = 0, sms = 0, major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const double peak_read = 2.0 * mem_khz * 1e3 * bus_bits / 8;
  int64_t ws = 0;
  auto gemm = cuda::Gemm::Create(CUDA_R_16BF, kGemmWorkspaceBytes, &ws);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  // The GEMM first: its warm-up raises the clocks the read test then runs at (as the backend measures them).
  auto rate = cuda::MeasureGemmRate(**gemm, true, 4096, nullptr);
  ASSERT_TRUE(rate.ok()) << rate.status();
  auto read = cuda::MeasureReadBandwidth(int64_t{1} << 30, nullptr);
  ASSERT_TRUE(read.ok()) << read.status();
  std::printf("[ ceilings ] read %.3g B/s of a %.3g B/s peak (%.2f); bf16 GEMM %.3g FLOP/s\n", *read, peak_read,
              *read / peak_read, *rate);
  EXPECT_GT(*read, 0.5 * peak_read);
  EXPECT_LT(*read, peak_read);
  if (major == 9) {
    const double peak_gemm = double(sms) * sm_khz * 1e3 * 4096;
    std::printf("[ ceilings ] bf16 GEMM at 4096^3: %.2f of a %.3g FLOP/s peak\n", *rate / peak_gemm, peak_gemm);
    EXPECT_GT(*rate, 0.3 * peak_gemm);
    EXPECT_LT(*rate, peak_gemm);
  } else {
    EXPECT_GT(*rate, 0);
  }
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

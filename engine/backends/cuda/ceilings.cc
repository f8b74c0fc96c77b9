#include "engine/backends/cuda/ceilings.h"

#include <chrono>
#include <tuple>
#include <vector>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/backends/cuda/run_timer.h"
#include "kernels/ceilings.h"
#include "kernels/fp8.h"

namespace inferd::cuda {

absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, cudaStream_t stream) {
  bytes -= bytes % 16;
  DeviceBuffer data, out;
  INFERD_RETURN_IF_ERROR(data.Allocate(bytes));
  INFERD_RETURN_IF_ERROR(out.Allocate(sizeof(float)));
  INFERD_CUDA(kernels::FillUniform16(data.get(), bytes / 2, true, 7, stream));
  int device = 0, sms = 0;
  INFERD_CUDA(cudaGetDevice(&device));
  INFERD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto run = [&] {
    return FromCuda(kernels::ReadReduce(data.get<float4>(), bytes / 16, out.get<float>(), sms, stream), "ReadReduce");
  };
  INFERD_RETURN_IF_ERROR(TimeRuns(run, 10, stream).status());  // warm-up
  INFERD_ASSIGN_OR_RETURN(const std::vector<float> ms, TimeRuns(run, 30, stream));
  const double s = 1e-3 * Median(ms);
  return bytes / s;
}

absl::StatusOr<double> MeasureGemmRate(Gemm& gemm, bool bf16, int64_t n, cudaStream_t stream, bool fp8) {
  DeviceBuffer a, b, c, a8, b8, scales;
  for (DeviceBuffer* m : {&a, &b, &c}) INFERD_RETURN_IF_ERROR(m->Allocate(n * n * 2));
  INFERD_CUDA(kernels::FillUniform16(a.get(), n * n, bf16, 1, stream));
  INFERD_CUDA(kernels::FillUniform16(b.get(), n * n, bf16, 2, stream));
  Operand x(a.get()), w(b.get());
  if (fp8) {
    for (DeviceBuffer* m : {&a8, &b8}) INFERD_RETURN_IF_ERROR(m->Allocate(n * n));
    INFERD_RETURN_IF_ERROR(scales.Allocate(2 * n * 4));
    for (auto [src, dst, s] : {std::tuple{&a, &a8, 0}, std::tuple{&b, &b8, 1}}) {
      float* row_scales = scales.get<float>() + s * n;
      INFERD_CUDA(
          bf16 ? kernels::QuantizeRowsFp8(src->get<__nv_bfloat16>(), n, n, dst->get<kernels::Fp8>(), row_scales, stream)
               : kernels::QuantizeRowsFp8(src->get<__half>(), n, n, dst->get<kernels::Fp8>(), row_scales, stream));
    }
    x = Operand(a8.get(), scales.get<float>());
    w = Operand(b8.get(), scales.get<float>() + n);
  }
  auto run = [&] { return gemm.Run(x, w, c.get(), n, n, n, nullptr, false, stream); };
  // The best rate over any kWindow consecutive runs in 400 ms of load from idle: the rate at the GPU's top clock.
  // A sustained GEMM first waits for the clock to rise from idle (up to ~150 ms), holds the top clock for a few
  // tens of milliseconds, and then its power management moves it by +-10% over the following second (on the
  // H100: ~790 TFLOP/s at first, then 590-740), so a median of a sustained run moves from run to run with the
  // GPU's temperature and power history while the top rate does not.
  constexpr int kWindow = 8;
  std::vector<float> ms;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(400)) {
    INFERD_ASSIGN_OR_RETURN(const std::vector<float> chunk, TimeRuns(run, kWindow, stream));
    ms.insert(ms.end(), chunk.begin(), chunk.end());
  }
  double best = 0;
  for (size_t i = 0; i + kWindow <= ms.size(); ++i) {
    float window = 0;
    for (int j = 0; j < kWindow; ++j) window += ms[i + j];
    if (best == 0 || window < best) best = window;
  }
  return kWindow * 2.0 * n * n * n / (1e-3 * best);
}

}  // namespace inferd::cuda

#include "engine/backends/cuda/ceilings.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/device_buffer.h"
#include "kernels/ceilings.h"

namespace inferd::cuda {
namespace {

// Median seconds of `reps` runs of fn on `stream`, timed with CUDA events after `warmup` runs.
template <typename F>
absl::StatusOr<double> MedianSeconds(F fn, int warmup, int reps, cudaStream_t stream) {
  cudaEvent_t a = nullptr, b = nullptr;
  absl::Status st = FromCuda(cudaEventCreate(&a), "cudaEventCreate");
  if (st.ok()) st = FromCuda(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; st.ok() && i < warmup + reps; ++i) {
    if (i >= warmup) st = FromCuda(cudaEventRecord(a, stream), "cudaEventRecord");
    if (st.ok()) st = fn();
    if (st.ok() && i >= warmup) {
      float t = 0;
      st = FromCuda(cudaEventRecord(b, stream), "cudaEventRecord");
      if (st.ok()) st = FromCuda(cudaEventSynchronize(b), "cudaEventSynchronize");
      if (st.ok()) st = FromCuda(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
      ms.push_back(t);
    }
  }
  if (a) cudaEventDestroy(a);
  if (b) cudaEventDestroy(b);
  if (!st.ok()) return st;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3;
}

}  // namespace

absl::StatusOr<double> MeasureReadBandwidth(int64_t bytes, cudaStream_t stream) {
  bytes -= bytes % 16;
  DeviceBuffer data, out;
  INFERD_RETURN_IF_ERROR(data.Allocate(bytes));
  INFERD_RETURN_IF_ERROR(out.Allocate(sizeof(float)));
  INFERD_CUDA(kernels::FillUniform16(data.get(), bytes / 2, true, 7, stream));
  int device = 0, sms = 0;
  INFERD_CUDA(cudaGetDevice(&device));
  INFERD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  INFERD_ASSIGN_OR_RETURN(const double s, MedianSeconds(
                                              [&] {
                                                return FromCuda(kernels::ReadReduce(data.get<float4>(), bytes / 16,
                                                                                    out.get<float>(), sms, stream),
                                                                "ReadReduce");
                                              },
                                              10, 30, stream));
  return bytes / s;
}

absl::StatusOr<double> MeasureGemmRate(Gemm& gemm, bool bf16, int64_t n, cudaStream_t stream) {
  DeviceBuffer a, b, c;
  for (DeviceBuffer* m : {&a, &b, &c}) INFERD_RETURN_IF_ERROR(m->Allocate(n * n * 2));
  INFERD_CUDA(kernels::FillUniform16(a.get(), n * n, bf16, 1, stream));
  INFERD_CUDA(kernels::FillUniform16(b.get(), n * n, bf16, 2, stream));
  auto run = [&] { return gemm.Run(a.get(), b.get(), c.get(), n, n, n, nullptr, false, stream); };
  // The clocks rise over tens of milliseconds of load (and an idle GPU starts low): warm up for 200 ms first.
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200)) {
    for (int i = 0; i < 8; ++i) INFERD_RETURN_IF_ERROR(run());
    INFERD_CUDA(cudaStreamSynchronize(stream));
  }
  INFERD_ASSIGN_OR_RETURN(const double s, MedianSeconds(run, 0, 30, stream));
  return 2.0 * n * n * n / s;
}

}  // namespace inferd::cuda

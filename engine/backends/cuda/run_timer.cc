#include "engine/backends/cuda/run_timer.h"

#include <algorithm>

#include "engine/backends/cuda/cuda_check.h"

namespace inferd::cuda {

absl::StatusOr<std::vector<float>> TimeRuns(const std::function<absl::Status()>& fn, int runs, cudaStream_t stream) {
  std::vector<cudaEvent_t> events(runs + 1, nullptr);
  absl::Status st;
  for (cudaEvent_t& e : events) {
    if (st.ok()) st = FromCuda(cudaEventCreate(&e), "cudaEventCreate");
  }
  if (st.ok()) st = FromCuda(cudaEventRecord(events[0], stream), "cudaEventRecord");
  for (int i = 0; st.ok() && i < runs; ++i) {
    st = fn();
    if (st.ok()) st = FromCuda(cudaEventRecord(events[i + 1], stream), "cudaEventRecord");
  }
  if (st.ok()) st = FromCuda(cudaEventSynchronize(events[runs]), "cudaEventSynchronize");
  std::vector<float> ms(runs, 0.f);
  for (int i = 0; st.ok() && i < runs; ++i) {
    st = FromCuda(cudaEventElapsedTime(&ms[i], events[i], events[i + 1]), "cudaEventElapsedTime");
  }
  for (cudaEvent_t e : events) {
    if (e) cudaEventDestroy(e);
  }
  if (!st.ok()) return st;
  return ms;
}

float Median(std::vector<float> times) {
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace inferd::cuda

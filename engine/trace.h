// NVTX ranges, so an Nsight Systems capture reads as the step's phases (schedule, prepare, forward, sample,
// output). Header-only NVTX 3 from the CUDA toolkit; with no toolkit the ranges compile to nothing.
#pragma once

#if INFERD_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace inferd {

class TraceRange {
 public:
  explicit TraceRange(const char* name) {
#if INFERD_WITH_NVTX
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~TraceRange() {
#if INFERD_WITH_NVTX
    nvtxRangePop();
#endif
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace inferd

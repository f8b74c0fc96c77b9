// The data-centre GPUs a deployment may be planned for without having one (`inferd plan --device NAME`): memory,
// read bandwidth and dense tensor-core peaks from NVIDIA's datasheets (sourced in gpu_specs.cc). Plain data: the
// planner's arithmetic stays the one the backend allocates by.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace inferd {

struct GpuSpec {
  const char* name;  // as --device takes it
  const char* full_name;
  int compute_capability;  // 80 = 8.0
  double memory_gib;       // the card's memory as the driver reports it
  double bandwidth_gb_s;   // memory bandwidth, GB/s (10^9 bytes)
  double bf16_tflops;      // dense bf16 tensor-core peak
  double fp8_tflops;       // dense fp8 peak; 0 where the GPU has no fp8 tensor cores
};

std::span<const GpuSpec> KnownGpus();
// The GPU of that name (case-insensitive), or null.
const GpuSpec* FindGpu(std::string_view name);
// "A100-80GB, H100-SXM, ..." for messages.
std::string KnownGpuNames();

}  // namespace inferd

// What inferd runs on each generation of NVIDIA GPU, and what of a build's GPU code a device runs. One row per
// architecture the `inferd-all` build compiles for (CMakeLists.txt's INFERD_ALL_CUDA_ARCHITECTURES; a test checks
// the two agree). Host-only: the cuda backend reads the device and asks here.
#pragma once

#include <span>
#include <string>

#include "absl/strings/string_view.h"

namespace inferd {

struct GpuArchitecture {
  int compute_capability;  // major × 10 + minor of the code built for it: 80, 86, 89, 90, 100, 120
  const char* code;        // its CUDA_ARCHITECTURES entry, without -real ("90a")
  const char* name;        // the generation and GPUs of it
  bool dependent_launch;   // programmatic dependent launch (kernels start while the one before drains)
  bool fp8;                // e4m3 tensor cores: engine.quantization fp8 and fp8 KV caches
};

std::span<const GpuArchitecture> GpuArchitectures();

// The row a device of compute capability `cc` (major × 10 + minor) runs: the newest row of its major version at or
// below it (an 8.7 runs the 8.6 row's code), or null where inferd has none (before 8.0; 11.x).
const GpuArchitecture* ArchitectureFor(int cc);

// The GPUs inferd runs on, for messages: "8.0 (Ampere: A100), 8.6 (...), ...".
std::string GpuArchitectureList();

// What a device runs of a build whose CUDA_ARCHITECTURES is `built` (entries split by ';' or ','): given the PTX
// version and the binary version the runtime reports for a kernel (major × 10 + minor), "sm_90a code from this
// build" where the build carries machine code of that version, else "compute_80 PTX compiled by the driver at
// first use".
std::string DescribeDeviceCode(absl::string_view built, int ptx_version, int binary_version);

}  // namespace inferd

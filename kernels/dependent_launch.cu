#include "kernels/dependent_launch.cuh"
#include "kernels/device_code.h"

namespace inferd::kernels {

bool DependentLaunchAllowed() {
  static const bool allowed = [] {
    int device = 0, major = 0, ptx = 0, binary = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        DeviceCode(&ptx, &binary) != cudaSuccess) {
      cudaGetLastError();  // a failed query leaves nothing behind: launches go in plain stream order
      return false;
    }
    return major >= 9 && ptx >= 90;  // the kernels' code, as the driver runs it, was compiled for 9.0 or later
  }();
  return allowed;
}

}  // namespace inferd::kernels

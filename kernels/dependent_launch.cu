#include "kernels/dependent_launch.cuh"

namespace inferd::kernels {
namespace {

__global__ void ProbeKernel() {
  WaitForPrerequisites();
}

}  // namespace

bool DependentLaunchAllowed() {
  static const bool allowed = [] {
    int device = 0, major = 0;
    cudaFuncAttributes attributes = {};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaFuncGetAttributes(&attributes, ProbeKernel) != cudaSuccess) {
      cudaGetLastError();  // a failed query leaves nothing behind: launches go in plain stream order
      return false;
    }
    return major >= 9 && attributes.ptxVersion >= 90;
  }();
  return allowed;
}

}  // namespace inferd::kernels

#include <string>

#include "kernels/device_code.h"

namespace inferd::kernels {
namespace {

__global__ void CodeProbeKernel() {}

}  // namespace

const char* BuiltCudaArchitectures() {
  return INFERD_CUDA_ARCHITECTURES;
}

cudaError_t DeviceCode(int* ptx_version, int* binary_version) {
  cudaFuncAttributes attributes = {};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, CodeProbeKernel);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return e;
  }
  *ptx_version = attributes.ptxVersion;
  *binary_version = attributes.binaryVersion;
  return cudaSuccess;
}

bool RunsSm90aCode(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (major != 9 || minor != 0) return false;
  const std::string built = std::string(",") + BuiltCudaArchitectures() + ",";
  return built.find(",90a,") != std::string::npos || built.find(",90a-real,") != std::string::npos;
}

}  // namespace inferd::kernels

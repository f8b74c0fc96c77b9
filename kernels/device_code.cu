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

}  // namespace inferd::kernels

// The GPU code this build carries (CMake's CUDA_ARCHITECTURES) and what of it the current device runs.
#pragma once

#include <cuda_runtime.h>

namespace inferd::kernels {

// The build's CUDA_ARCHITECTURES, entries split by commas: "90a", or "80-real,86-real,...,120-virtual".
const char* BuiltCudaArchitectures();

// What the current device runs of this build: the PTX version its code was compiled from and the version of the
// machine code it runs (both major × 10 + minor; a PTX-only build's binary version is the device's, compiled by
// the driver). cudaErrorNoKernelImageForDevice (or another error) where the build has nothing the device runs;
// the error is cleared.
cudaError_t DeviceCode(int* ptx_version, int* binary_version);

// Whether `device` runs this build's sm_90a machine code: a compute capability 9.0 GPU and a "90a" entry in the
// build's list. Kernels written with wgmma and TMA (CUTLASS's SM90 collectives, FlashInfer's Hopper attention)
// exist only there; on any other GPU or build their bodies are empty.
bool RunsSm90aCode(int device);

}  // namespace inferd::kernels

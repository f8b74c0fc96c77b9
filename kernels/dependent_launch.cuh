// Programmatic dependent launch (sm_90): a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization
// may start while the kernel before it on the stream still runs; it must call WaitForPrerequisites() before it
// reads anything that kernel writes, and may do independent work (stream weights) before that. A kernel calls
// AllowDependentsToLaunch() to let such a successor start early. Both are no-ops below sm_90 and when the
// launch did not ask for it. LaunchDependent (host) makes such a launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/dependent_launch.h"

namespace inferd::kernels {

__device__ __forceinline__ void AllowDependentsToLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Returns once every kernel this one depends on has completed and its writes are visible.
__device__ __forceinline__ void WaitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Host: launches kernel with smem_bytes of dynamic shared memory, as a programmatic dependent of the kernel before
// it on `stream` where `early` and DependentLaunchAllowed (else in plain stream order).
template <typename... Params, typename... Args>
cudaError_t LaunchMaybeDependent(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                 cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = early && DependentLaunchAllowed() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Host: launches kernel as a programmatic dependent of the kernel before it on `stream` where DependentLaunchAllowed
// (else in plain stream order); the kernel must call WaitForPrerequisites() before it touches memory that kernel
// reads or writes.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  return LaunchMaybeDependent(true, kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace inferd::kernels

// Programmatic dependent launch (sm_90): a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization
// may start while the kernel before it on the stream still runs; it must call WaitForPrerequisites() before it
// reads anything that kernel writes, and may do independent work (stream weights) before that. A kernel calls
// AllowDependentsToLaunch() to let such a successor start early. Both are no-ops below sm_90 and when the
// launch did not ask for it. Device code only.
#pragma once

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

}  // namespace inferd::kernels

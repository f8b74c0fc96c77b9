// Asynchronous copies from global to shared memory (cp.async, sm_80), shared by the attention kernels of our own
// (device code only).
#pragma once

#include <cuda_runtime.h>

namespace inferd::kernels {

// 16 bytes from global to shared; valid false: 16 zeros, nothing read.
__device__ __forceinline__ void CopyAsync16(void* shared, const void* global, bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(global), "r"(valid ? 16 : 0) : "memory");
}
// Closes the thread's group of copies issued since the last one.
__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Returns once at most kPending of the thread's groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace inferd::kernels

// Owning device and pinned host allocations (freed on destruction), and a running count of device bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/status_macros.h"

namespace inferd::cuda {

inline cudaError_t MallocDevice(void** p, size_t n) {
  return cudaMalloc(p, n);
}
inline cudaError_t MallocPinned(void** p, size_t n) {
  return cudaMallocHost(p, n);
}

// Memory from cudaMalloc (Device) or cudaMallocHost (Pinned), freed on destruction; movable, not copyable.
template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
class CudaAllocation {
 public:
  CudaAllocation() = default;
  ~CudaAllocation() {
    if (ptr_) Free(ptr_);
  }
  CudaAllocation(CudaAllocation&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  CudaAllocation& operator=(CudaAllocation&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;

  // Allocates `bytes` (at least 1) in place of what was held, adding them to *counter when given.
  absl::Status Allocate(size_t bytes, int64_t* counter = nullptr) {
    if (ptr_) Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    if (cudaError_t e = Alloc(&ptr_, bytes > 0 ? bytes : 1); e != cudaSuccess) {
      ptr_ = nullptr;
      const absl::Status s = FromCuda(e, Alloc == MallocDevice ? "cudaMalloc" : "cudaMallocHost");
      return absl::Status(s.code(), absl::StrCat(s.message(), " while allocating ", bytes, " bytes"));
    }
    bytes_ = bytes;
    if (counter) *counter += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = CudaAllocation<MallocDevice, cudaFree>;
using PinnedBuffer = CudaAllocation<MallocPinned, cudaFreeHost>;

}  // namespace inferd::cuda

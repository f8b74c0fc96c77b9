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

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Allocates `bytes` (at least 1), adding them to *counter when given.
  absl::Status Allocate(size_t bytes, int64_t* counter = nullptr) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    INFERD_CUDA(cudaMalloc(&ptr_, bytes > 0 ? bytes : 1));
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

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  absl::Status Allocate(size_t bytes) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    INFERD_CUDA(cudaMallocHost(&ptr_, bytes > 0 ? bytes : 1));
    bytes_ = bytes;
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

}  // namespace inferd::cuda

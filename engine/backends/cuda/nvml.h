// NVML, the driver's monitoring library, loaded at run time: libnvidia-ml.so.1 comes with the driver, not the
// CUDA toolkit, so inferd neither links it nor needs its header. Reads one device's utilisation, memory,
// power, temperature, SM clock and energy counter. NVML calls are thread-safe.
#pragma once

#include <memory>

#include "engine/runtime/backend.h"

namespace inferd::cuda {

class Nvml {
 public:
  // The NVML device that is CUDA device `cuda_device` (matched by PCI bus id, so CUDA_VISIBLE_DEVICES holds);
  // null, with a log line saying why, when the library or the device cannot be opened.
  static std::unique_ptr<Nvml> Open(int cuda_device);
  ~Nvml();
  // What the device reports now; fields it does not support stay empty.
  DeviceReading Read() const;

  struct Api;

 private:
  Nvml() = default;
  std::unique_ptr<Api> api_;
};

}  // namespace inferd::cuda

#include "engine/backends/cuda/nvml.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <type_traits>

namespace inferd::cuda {
namespace {

// The few NVML declarations used, as the library's C ABI defines them.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  nvmlDevice_t device = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*power_mw)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*clock_mhz)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*energy_mj)(nvmlDevice_t, unsigned long long*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Open(int cuda_device) {
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    spdlog::warn("NVML: cannot load libnvidia-ml.so.1 ({}): no GPU power, energy or clock metrics", dlerror());
    return nullptr;
  }
  bool found = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->lib, name));
    found = found && fn != nullptr;
  };
  sym(api->init, "nvmlInit_v2");
  sym(api->shutdown, "nvmlShutdown");
  sym(api->error_string, "nvmlErrorString");
  sym(api->by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  sym(api->utilization, "nvmlDeviceGetUtilizationRates");
  sym(api->memory, "nvmlDeviceGetMemoryInfo");
  sym(api->power_mw, "nvmlDeviceGetPowerUsage");
  sym(api->temperature, "nvmlDeviceGetTemperature");
  sym(api->clock_mhz, "nvmlDeviceGetClockInfo");
  sym(api->energy_mj, "nvmlDeviceGetTotalEnergyConsumption");
  if (!found) {
    spdlog::warn("NVML: libnvidia-ml.so.1 lacks a function inferd reads: no GPU sensor metrics");
    dlclose(api->lib);
    return nullptr;
  }
  if (nvmlReturn_t r = api->init(); r != kNvmlSuccess) {
    spdlog::warn("NVML: nvmlInit failed ({}): no GPU sensor metrics", api->error_string(r));
    dlclose(api->lib);
    return nullptr;
  }
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, cuda_device) != cudaSuccess) {
    spdlog::warn("NVML: no PCI bus id for CUDA device {}: no GPU sensor metrics", cuda_device);
    api->shutdown();
    dlclose(api->lib);
    return nullptr;
  }
  if (nvmlReturn_t r = api->by_pci_bus_id(bus_id, &api->device); r != kNvmlSuccess) {
    spdlog::warn("NVML: device {} not found ({}): no GPU sensor metrics", bus_id, api->error_string(r));
    api->shutdown();
    dlclose(api->lib);
    return nullptr;
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->api_ = std::move(api);
  return nvml;
}

Nvml::~Nvml() {
  if (api_ && api_->lib) {
    api_->shutdown();
    dlclose(api_->lib);
  }
}

DeviceReading Nvml::Read() const {
  DeviceReading r;
  const Api& a = *api_;
  if (nvmlUtilization_t u; a.utilization(a.device, &u) == kNvmlSuccess) r.utilization = u.gpu / 100.0;
  if (nvmlMemory_t m; a.memory(a.device, &m) == kNvmlSuccess) r.memory_used_bytes = static_cast<double>(m.used);
  if (unsigned int mw; a.power_mw(a.device, &mw) == kNvmlSuccess) r.power_w = mw * 1e-3;
  if (unsigned int c; a.temperature(a.device, kTemperatureGpu, &c) == kNvmlSuccess) r.temperature_c = c;
  if (unsigned int mhz; a.clock_mhz(a.device, kClockSm, &mhz) == kNvmlSuccess) r.sm_clock_hz = mhz * 1e6;
  if (unsigned long long mj; a.energy_mj(a.device, &mj) == kNvmlSuccess) r.energy_j = mj * 1e-3;
  return r;
}

}  // namespace inferd::cuda

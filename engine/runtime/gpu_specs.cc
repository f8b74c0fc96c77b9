#include "engine/runtime/gpu_specs.h"

#include <algorithm>
#include <cctype>

namespace inferd {
namespace {

// NVIDIA's datasheets (dense peaks: the sparse figures they also print are twice these). Memory is what the driver
// reports (nvidia-smi's total), a little under the marketed GB.
//   A100: "NVIDIA A100 Tensor Core GPU" datasheet — 40GB 1,555 GB/s, 80GB SXM 2,039 GB/s, BF16 312 TFLOPS.
//   A10: "NVIDIA A10 Tensor Core GPU" datasheet — 24GB, 600 GB/s, BF16 125 TFLOPS.
//   L4: "NVIDIA L4 Tensor Core GPU" datasheet — 24GB, 300 GB/s, BF16 121 TFLOPS, FP8 242.5 TFLOPS.
//   L40S: "NVIDIA L40S" datasheet — 48GB, 864 GB/s, BF16 362 TFLOPS, FP8 733 TFLOPS.
//   H100: "NVIDIA H100 Tensor Core GPU" datasheet — SXM 80GB 3.35 TB/s, BF16 989, FP8 1,979 TFLOPS; PCIe 80GB
//     2.0 TB/s, BF16 756, FP8 1,513 TFLOPS. (Measured on an H100 SXM here: 3.07 TB/s read, 772–810 TFLOP/s bf16.)
//   H200: "NVIDIA H200 Tensor Core GPU" datasheet — 141GB, 4.8 TB/s, BF16 989, FP8 1,979 TFLOPS.
//   B200: "NVIDIA HGX B200" datasheet — 180GB a GPU (1.4 TB for eight), 8 TB/s, BF16 2.25 PFLOPS, FP8 4.5 PFLOPS
//     (its reported memory here is an estimate: ~179 GiB).
constexpr GpuSpec kGpus[] = {
    {"A100-40GB", "NVIDIA A100 40GB", 80, 40.0, 1555, 312, 0},
    {"A100-80GB", "NVIDIA A100 80GB SXM", 80, 80.0, 2039, 312, 0},
    {"A10", "NVIDIA A10", 86, 22.5, 600, 125, 0},
    {"L4", "NVIDIA L4", 89, 22.5, 300, 121, 242.5},
    {"L40S", "NVIDIA L40S", 89, 45.0, 864, 362, 733},
    {"H100-PCIE", "NVIDIA H100 PCIe 80GB", 90, 79.6, 2000, 756, 1513},
    {"H100-SXM", "NVIDIA H100 SXM 80GB", 90, 79.6, 3350, 989, 1979},
    {"H200", "NVIDIA H200 141GB", 90, 140.4, 4800, 989, 1979},
    {"B200", "NVIDIA B200 180GB", 100, 179.0, 8000, 2250, 4500},
};

bool SameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::span<const GpuSpec> KnownGpus() {
  return kGpus;
}

const GpuSpec* FindGpu(std::string_view name) {
  for (const GpuSpec& g : kGpus) {
    if (SameName(g.name, name)) return &g;
  }
  return nullptr;
}

std::string KnownGpuNames() {
  std::string out;
  for (const GpuSpec& g : kGpus) out += (out.empty() ? "" : ", ") + std::string(g.name);
  return out;
}

}  // namespace inferd

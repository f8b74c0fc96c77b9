#include "engine/backends/cuda/architectures.h"

#include <array>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace inferd {

namespace {

// Attention runs FlashInfer's FA2-style paged kernels on every row, and on 9.0 running sm_90a code its Hopper
// prefill kernel (FA3) for steps that fill its tiles (kernels/device_code.h RunsSm90aCode decides, as for CUTLASS's
// grouped GEMM); the rest of the forward pass is our kernels and cuBLASLt on every row.
constexpr std::array<GpuArchitecture, 6> kArchitectures = {{
    {80, "80", "Ampere: A100, A30", false, false},
    {86, "86", "Ampere: A10, A40, RTX A6000, RTX 30xx", false, false},
    {89, "89", "Ada: L4, L40S, RTX 6000 Ada, RTX 40xx", false, true},
    {90, "90a", "Hopper: H100, H200, GH200", true, true},
    {100, "100", "Blackwell: B200, GB200", true, true},
    {120, "120", "Blackwell: RTX PRO 6000, RTX 50xx", true, true},
}};

}  // namespace

std::span<const GpuArchitecture> GpuArchitectures() {
  return kArchitectures;
}

const GpuArchitecture* ArchitectureFor(int cc) {
  const GpuArchitecture* best = nullptr;
  for (const GpuArchitecture& a : kArchitectures) {
    if (a.compute_capability / 10 == cc / 10 && a.compute_capability <= cc) best = &a;
  }
  return best;
}

std::string GpuArchitectureList() {
  std::string out;
  for (const GpuArchitecture& a : kArchitectures) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", a.compute_capability / 10, ".", a.compute_capability % 10, " (",
                    a.name, ")");
  }
  return out;
}

std::string DescribeDeviceCode(absl::string_view built, int ptx_version, int binary_version) {
  for (absl::string_view entry : absl::StrSplit(built, absl::ByAnyChar(";,"), absl::SkipWhitespace())) {
    if (absl::EndsWith(entry, "-virtual")) continue;  // PTX only
    absl::string_view code = entry;
    absl::ConsumeSuffix(&code, "-real");
    absl::string_view digits = code;
    absl::ConsumeSuffix(&digits, "a");
    if (digits == absl::StrCat(binary_version)) return absl::StrCat("sm_", code, " code from this build");
  }
  return absl::StrCat("compute_", ptx_version, " PTX compiled by the driver at first use (this build carries ", built,
                      ")");
}

}  // namespace inferd

#include "engine/backends/cuda/layer_walk.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace inferd {

namespace {

std::string ProgramProblem(const std::vector<LayerOp>& p) {
  using enum LayerOp;
  if (p.empty() || p.front() != kInputNorm || p.back() != kResidual) {
    return "the cuda backend runs layers that begin with the input norm and end with a residual add";
  }
  for (size_t i = 0; i < p.size(); ++i) {
    const bool last = i + 1 == p.size();
    const LayerOp prev = i > 0 ? p[i - 1] : kInputNorm, next = last ? kInputNorm : p[i + 1];
    if (p[i] == kInputNorm && i != 0) return "an input norm inside the layer";
    if (p[i] == kResidual && !last && next != kPostNorm) {
      return absl::StrCat("a residual add followed by '", LayerOpName(next),
                          "' (the cuda backend fuses a residual add with the norm after it)");
    }
    if (p[i] == kPostNorm && prev != kResidual) return "the post-attention norm not right after a residual add";
    if ((p[i] == kRope) != (next == kWriteKv) || (p[i] == kWriteKv && prev != kRope)) {
      return "the rotary embedding not right before the K/V write (one kernel on cuda)";
    }
    if (p[i] == kQkNorm && next != kRope) return "the per-head q/k norms not right before the rotary embedding";
    const auto gated = [](LayerOp op) { return op == kSiluMul || op == kGeluTanhMul; };
    if ((p[i] == kGateUpProj) != gated(next) || (gated(p[i]) && prev != kGateUpProj)) {
      return "the gated activation not right after the gate/up product (one kernel on cuda at decode)";
    }
  }
  return "";
}

}  // namespace

std::string LayerWalkProblem(const Architecture& arch) {
  std::string why = ProgramProblem(arch.layer);
  if (why.empty() && !arch.dense_layer.empty()) why = ProgramProblem(arch.dense_layer);
  return why;
}

}  // namespace inferd

#include "engine/model/architecture.h"

#include <algorithm>

namespace inferd {
namespace {

const std::vector<const Architecture*>& Families() {
  static const std::vector<const Architecture*> families = {
      &LlamaArchitecture(), &Qwen2Architecture(), &Qwen3Architecture(), &Gemma3Architecture(), &Phi3Architecture()};
  return families;
}

template <typename Names>
const Architecture* Find(std::string_view name, Names Architecture::*names) {
  for (const Architecture* a : Families()) {
    const auto& list = a->*names;
    if (std::find(list.begin(), list.end(), name) != list.end()) return a;
  }
  return nullptr;
}

template <typename Names>
std::string Join(Names Architecture::*names) {
  std::string all;
  for (const Architecture* a : Families()) {
    for (std::string_view n : a->*names) all.append(all.empty() ? "" : ", ").append(n);
  }
  return all;
}

}  // namespace

const char* LayerOpName(LayerOp op) {
  switch (op) {
    case LayerOp::kInputNorm:
      return "input_norm";
    case LayerOp::kQkvProj:
      return "qkv_proj";
    case LayerOp::kQkNorm:
      return "qk_norm";
    case LayerOp::kRope:
      return "rope";
    case LayerOp::kWriteKv:
      return "write_kv";
    case LayerOp::kAttention:
      return "attention";
    case LayerOp::kOutProj:
      return "o_proj";
    case LayerOp::kSumRanks:
      return "sum_ranks";
    case LayerOp::kResidual:
      return "residual";
    case LayerOp::kPostNorm:
      return "post_norm";
    case LayerOp::kGateUpProj:
      return "gate_up_proj";
    case LayerOp::kSiluMul:
      return "silu_mul";
    case LayerOp::kDownProj:
      return "down_proj";
    case LayerOp::kAttnOutNorm:
      return "attn_out_norm";
    case LayerOp::kGeluTanhMul:
      return "gelu_tanh_mul";
    case LayerOp::kMlpOutNorm:
      return "mlp_out_norm";
  }
  return "?";
}

const Architecture* FindArchitecture(std::string_view hf_architecture) {
  return Find(hf_architecture, &Architecture::hf_architectures);
}

const Architecture* FindGgufArchitecture(std::string_view gguf_architecture) {
  return Find(gguf_architecture, &Architecture::gguf_architectures);
}

std::string SupportedArchitectures() {
  return Join(&Architecture::hf_architectures);
}

std::string SupportedGgufArchitectures() {
  return Join(&Architecture::gguf_architectures);
}

}  // namespace inferd

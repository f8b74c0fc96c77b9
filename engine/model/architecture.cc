#include "engine/model/architecture.h"

#include <algorithm>

namespace inferd {
namespace {

const std::vector<const Architecture*>& Families() {
  static const std::vector<const Architecture*> families = {
      &LlamaArchitecture(),  &Qwen2Architecture(), &Qwen3Architecture(),   &Gemma2Architecture(),
      &Gemma3Architecture(), &Phi3Architecture(),  &MixtralArchitecture(), &Qwen3MoeArchitecture()};
  return families;
}

template <typename Names, typename Also>
const Architecture* Find(std::string_view name, Names Architecture::*names, Also also) {
  for (const Architecture* a : Families()) {
    const auto& list = a->*names;
    if (std::find(list.begin(), list.end(), name) != list.end() && also(*a)) return a;
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
    case LayerOp::kMoe:
      return "moe";
  }
  return "?";
}

const char* LayerRoleName(LayerRole role) {
  static constexpr const char* kNames[] = {"input_norm",    "q_proj",    "k_proj",      "v_proj",    "q_bias",
                                           "k_bias",        "v_bias",    "q_norm",      "k_norm",    "o_proj",
                                           "attn_out_norm", "post_norm", "gate_proj",   "up_proj",   "down_proj",
                                           "mlp_out_norm",  "router",    "expert_gate", "expert_up", "expert_down"};
  const auto i = static_cast<size_t>(role);
  return i < std::size(kNames) ? kNames[i] : "?";
}

bool Architecture::has(LayerRole role) const {
  const auto is = [&](const TensorSpec& t) { return t.role == role; };
  return std::any_of(tensors.begin(), tensors.end(), is) ||
         std::any_of(expert_tensors.begin(), expert_tensors.end(), is);
}

std::vector<TensorSpec> WithoutDenseMlp(std::vector<TensorSpec> specs) {
  std::erase_if(specs, [](const TensorSpec& t) {
    return t.role == LayerRole::kGateProj || t.role == LayerRole::kUpProj || t.role == LayerRole::kDownProj;
  });
  return specs;
}

bool IsExpertRole(LayerRole role) {
  return role == LayerRole::kExpertGate || role == LayerRole::kExpertUp || role == LayerRole::kExpertDown;
}

std::vector<TensorSpec> LlamaTensors() {
  using enum Dim;
  using enum LayerRole;
  return {{"input_layernorm.weight", "attn_norm.weight", kOne, kHidden, kInputNorm},
          {"self_attn.q_proj.weight", "attn_q.weight", kQ, kHidden, kQProj},
          {"self_attn.k_proj.weight", "attn_k.weight", kKv, kHidden, kKProj},
          {"self_attn.v_proj.weight", "attn_v.weight", kKv, kHidden, kVProj},
          {"self_attn.o_proj.weight", "attn_output.weight", kHidden, kQ, kOProj},
          {"post_attention_layernorm.weight", "ffn_norm.weight", kOne, kHidden, kPostNorm},
          {"mlp.gate_proj.weight", "ffn_gate.weight", kFf, kHidden, kGateProj},
          {"mlp.up_proj.weight", "ffn_up.weight", kFf, kHidden, kUpProj},
          {"mlp.down_proj.weight", "ffn_down.weight", kHidden, kFf, kDownProj}};
}

std::vector<TensorSpec> QkNormTensors() {
  using enum Dim;
  using enum LayerRole;
  return {{"self_attn.q_norm.weight", "attn_q_norm.weight", kOne, kHeadDim, kQNorm},
          {"self_attn.k_norm.weight", "attn_k_norm.weight", kOne, kHeadDim, kKNorm}};
}

std::vector<TensorSpec> MoeTensors(std::string_view router, std::string_view gate, std::string_view up,
                                   std::string_view down) {
  using enum Dim;
  using enum LayerRole;
  return {{router, "ffn_gate_inp.weight", kExperts, kHidden, kRouter},
          {gate, "ffn_gate_exps.weight", kMoeFf, kHidden, kExpertGate},
          {up, "ffn_up_exps.weight", kMoeFf, kHidden, kExpertUp},
          {down, "ffn_down_exps.weight", kHidden, kMoeFf, kExpertDown}};
}

std::vector<TensorSpec> InsertAfter(std::vector<TensorSpec> specs, LayerRole after, std::vector<TensorSpec> added) {
  auto at = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& t) { return t.role == after; });
  specs.insert(at == specs.end() ? at : at + 1, added.begin(), added.end());
  return specs;
}

std::vector<TensorSpec> Rename(std::vector<TensorSpec> specs, LayerRole role, std::string_view hf,
                               std::string_view gguf) {
  for (TensorSpec& t : specs) {
    if (t.role == role) t.hf = hf, t.gguf = gguf;
  }
  return specs;
}

const Architecture* FindArchitecture(std::string_view hf_architecture) {
  return Find(hf_architecture, &Architecture::hf_architectures, [](const Architecture&) { return true; });
}

const Architecture* FindGgufArchitecture(std::string_view gguf_architecture, bool experts) {
  return Find(gguf_architecture, &Architecture::gguf_architectures,
              [&](const Architecture& a) { return a.expert_tensors.empty() != experts; });
}

std::string SupportedArchitectures() {
  return Join(&Architecture::hf_architectures);
}

std::string SupportedGgufArchitectures() {
  std::string all;
  for (const Architecture* a : Families()) {
    for (std::string_view n : a->gguf_architectures) {
      all.append(all.empty() ? "" : ", ").append(n).append(a->expert_tensors.empty() ? "" : " (with experts)");
    }
  }
  return all;
}

}  // namespace inferd

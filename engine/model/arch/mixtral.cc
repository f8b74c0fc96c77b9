// Mixtral: Llama's attention, and in every layer a mixture of experts in place of the MLP (a softmax router over
// num_local_experts SiLU-gated experts, the top num_experts_per_tok taken and their weights renormalised).
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& MixtralArchitecture() {
  using enum LayerOp;
  using enum Dim;
  static const Architecture arch{
      .name = "mixtral",
      .hf_architectures = {"MixtralForCausalLM"},
      .tensors = WithoutDenseMlp(LlamaTensors()),
      .layer = {kInputNorm, kQkvProj, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kResidual, kPostNorm, kMoe,
                kSumRanks, kResidual},
      .expert_tensors = {{"block_sparse_moe.gate.weight", "", kExperts, kHidden, LayerRole::kRouter},
                         {"block_sparse_moe.experts.{e}.w1.weight", "", kMoeFf, kHidden, LayerRole::kExpertGate},
                         {"block_sparse_moe.experts.{e}.w3.weight", "", kMoeFf, kHidden, LayerRole::kExpertUp},
                         {"block_sparse_moe.experts.{e}.w2.weight", "", kHidden, kMoeFf, LayerRole::kExpertDown}},
  };
  return arch;
}

}  // namespace inferd

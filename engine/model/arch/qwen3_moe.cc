// Qwen3-MoE: Qwen3's attention (per-head q/k norms), and a mixture of experts in place of the MLP in the layers the
// config makes sparse (every decoder_sparse_step-th, less mlp_only_layers); the others keep Qwen3's dense MLP.
// The router is a softmax over num_experts, the top num_experts_per_tok taken, renormalised where norm_topk_prob.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& Qwen3MoeArchitecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "qwen3_moe",
      .hf_architectures = {"Qwen3MoeForCausalLM"},
      .gguf_architectures = {"qwen3moe"},
      .tensors = InsertAfter(LlamaTensors(), LayerRole::kVProj, QkNormTensors()),
      .layer = {kInputNorm, kQkvProj, kQkNorm, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kResidual, kPostNorm,
                kMoe, kSumRanks, kResidual},
      .expert_tensors = MoeTensors("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                                   "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
      .dense_layer = {kInputNorm, kQkvProj, kQkNorm, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kResidual,
                      kPostNorm, kGateUpProj, kSiluMul, kDownProj, kSumRanks, kResidual},
      .normalize_top_k = false,  // transformers' Qwen3MoeConfig default; the released models set norm_topk_prob
  };
  return arch;
}

}  // namespace inferd

// Mixtral: Llama's attention, and in every layer a mixture of experts in place of the MLP (a softmax router over
// num_local_experts SiLU-gated experts, the top num_experts_per_tok taken and their weights renormalised).
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& MixtralArchitecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "mixtral",
      .hf_architectures = {"MixtralForCausalLM"},
      .gguf_architectures = {"llama"},  // llama.cpp's converter writes Mixtral as llama with experts
      .gguf_interleaved_rotary = true,
      .tensors = WithoutDenseMlp(LlamaTensors()),
      .layer = {kInputNorm, kQkvProj, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kResidual, kPostNorm, kMoe,
                kSumRanks, kResidual},
      .expert_tensors = MoeTensors("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                                   "block_sparse_moe.experts.{e}.w3.weight", "block_sparse_moe.experts.{e}.w2.weight"),
  };
  return arch;
}

}  // namespace inferd

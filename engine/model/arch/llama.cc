// Llama 2/3, Mistral and SmolLM: pre-norm decoder layers, grouped-query attention with the rotary embedding, a
// SiLU-gated MLP.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& LlamaArchitecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "llama",
      .hf_architectures = {"LlamaForCausalLM", "MistralForCausalLM"},
      .gguf_architectures = {"llama", "mistral"},
      .gguf_interleaved_rotary = true,
      .tensors = LlamaTensors(),
      .layer = {kInputNorm, kQkvProj, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kResidual, kPostNorm,
                kGateUpProj, kSiluMul, kDownProj, kSumRanks, kResidual},
  };
  return arch;
}

}  // namespace inferd

// Qwen3 (dense): Llama's layer with an RMS norm over each q and k head before the rotary embedding, and no
// q/k/v bias.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& Qwen3Architecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "qwen3",
      .hf_architectures = {"Qwen3ForCausalLM"},
      .gguf_architectures = {"qwen3"},
      .tensors = InsertAfter(LlamaTensors(), LayerRole::kVProj, QkNormTensors()),
      .layer = {kInputNorm, kQkvProj, kQkNorm, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kResidual, kPostNorm,
                kGateUpProj, kSiluMul, kDownProj, kSumRanks, kResidual},
  };
  return arch;
}

}  // namespace inferd

// Gemma 3 (text): norms before and after each half of the layer, multiplying by 1 + weight; per-head q/k norms;
// a GeGLU MLP with the tanh GELU; embeddings scaled by √hidden; sliding-window layers (a window and a rotary
// base of their own) interleaved with global ones; the softmax scale from query_pre_attn_scalar.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& Gemma3Architecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "gemma3",
      .hf_architectures = {"Gemma3ForCausalLM"},
      .gguf_architectures = {"gemma3"},
      .qk_norm = true,
      .norms_add_one = true,
      .sandwich_norms = true,
      .scaled_embeddings = true,
      .sliding_window_pattern = 6,
      .sliding_rope_theta = 10000.0,
      .layer = {kInputNorm, kQkvProj, kQkNorm, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kAttnOutNorm,
                kResidual, kPostNorm, kGateUpProj, kGeluTanhMul, kDownProj, kSumRanks, kMlpOutNorm, kResidual},
  };
  return arch;
}

}  // namespace inferd

// Gemma 3 (text): norms before and after each half of the layer, multiplying by 1 + weight; per-head q/k norms;
// a GeGLU MLP with the tanh GELU; embeddings scaled by √hidden; sliding-window layers (a window and a rotary
// base of their own) interleaved with global ones; the softmax scale from query_pre_attn_scalar.
#include "engine/model/architecture.h"

namespace inferd {

namespace {

// Llama's tensors with per-head q/k norms and a norm on each half's output: its post_attention_layernorm is on the
// attention output, the norm before the MLP is pre_feedforward_layernorm. GGUF files store each norm as 1 + w
// (llama.cpp's converter adds the one).
std::vector<TensorSpec> Gemma3Tensors() {
  using enum Dim;
  using enum LayerRole;
  std::vector<TensorSpec> t = InsertAfter(LlamaTensors(), kVProj, QkNormTensors());
  t = Rename(t, kPostNorm, "pre_feedforward_layernorm.weight", "ffn_norm.weight");
  t = InsertAfter(t, kOProj,
                  {{"post_attention_layernorm.weight", "post_attention_norm.weight", kOne, kHidden, kAttnOutNorm}});
  return InsertAfter(t, kDownProj,
                     {{"post_feedforward_layernorm.weight", "post_ffw_norm.weight", kOne, kHidden, kMlpOutNorm}});
}

}  // namespace

const Architecture& Gemma3Architecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "gemma3",
      .hf_architectures = {"Gemma3ForCausalLM"},
      .gguf_architectures = {"gemma3"},
      .norms_add_one = true,
      .scaled_embeddings = true,
      .sliding_window_pattern = 6,
      .sliding_rope_theta = 10000.0,
      .tensors = Gemma3Tensors(),
      .layer = {kInputNorm, kQkvProj, kQkNorm, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kAttnOutNorm,
                kResidual, kPostNorm, kGateUpProj, kGeluTanhMul, kDownProj, kSumRanks, kMlpOutNorm, kResidual},
  };
  return arch;
}

}  // namespace inferd

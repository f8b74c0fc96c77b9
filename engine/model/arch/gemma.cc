// Gemma 2 and Gemma 3 (text): norms before and after each half of the layer, multiplying by 1 + weight; a GeGLU MLP
// with the tanh GELU; embeddings scaled by √hidden; sliding-window layers interleaved with global ones; the softmax
// scale from query_pre_attn_scalar; the final logits soft-capped where the config says. Gemma 2 alternates window
// and global layers on one rotary base and soft-caps attention scores; Gemma 3 adds per-head q/k norms, keeps one
// global layer in six, with a rotary base of the window layers' own.
#include "engine/model/architecture.h"

namespace inferd {

namespace {

// Llama's tensors with a norm on each half's output: its post_attention_layernorm is on the attention output, the
// norm before the MLP is pre_feedforward_layernorm. GGUF files store each norm as 1 + w (llama.cpp's converter adds
// the one).
std::vector<TensorSpec> GemmaTensors() {
  using enum Dim;
  using enum LayerRole;
  std::vector<TensorSpec> t = Rename(LlamaTensors(), kPostNorm, "pre_feedforward_layernorm.weight", "ffn_norm.weight");
  t = InsertAfter(t, kOProj,
                  {{"post_attention_layernorm.weight", "post_attention_norm.weight", kOne, kHidden, kAttnOutNorm}});
  return InsertAfter(t, kDownProj,
                     {{"post_feedforward_layernorm.weight", "post_ffw_norm.weight", kOne, kHidden, kMlpOutNorm}});
}

}  // namespace

const Architecture& Gemma2Architecture() {
  using enum LayerOp;
  static const Architecture arch{
      .name = "gemma2",
      .hf_architectures = {"Gemma2ForCausalLM"},
      .norms_add_one = true,
      .scaled_embeddings = true,
      .sliding_window_pattern = 2,
      .attn_softcap = true,
      .tensors = GemmaTensors(),
      .layer = {kInputNorm, kQkvProj, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kAttnOutNorm, kResidual,
                kPostNorm, kGateUpProj, kGeluTanhMul, kDownProj, kSumRanks, kMlpOutNorm, kResidual},
  };
  return arch;
}

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
      .tensors = InsertAfter(GemmaTensors(), LayerRole::kVProj, QkNormTensors()),
      .layer = {kInputNorm, kQkvProj, kQkNorm, kRope, kWriteKv, kAttention, kOutProj, kSumRanks, kAttnOutNorm,
                kResidual, kPostNorm, kGateUpProj, kGeluTanhMul, kDownProj, kSumRanks, kMlpOutNorm, kResidual},
  };
  return arch;
}

}  // namespace inferd

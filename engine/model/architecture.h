// A model family, written once: which config.json and GGUF architectures it answers to, the tensors its layers
// have beyond the common ones, and its decoder layer as a short program over a closed set of building blocks.
// Each backend implements each block once and runs a layer by walking the program (the cpu backend, the fp32
// reference, does; see docs/DESIGN.md for the cuda backend's part). One file per family in engine/model/arch/.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace inferd {

// The building blocks, over a layer's activations: x (the residual stream), xn (a normed copy), qkv, attn, tmp
// (a row-parallel product's output), gate_up and act.
enum class LayerOp {
  kInputNorm,    // xn = rmsnorm(x) · input_norm
  kQkvProj,      // qkv = xn · W_qkvᵀ (+ the q/k/v bias where the family has one)
  kQkNorm,       // every q head and every k head of qkv: rmsnorm over head_dim · q_norm (k_norm)
  kRope,         // the rotary embedding on q and k
  kWriteKv,      // k and v into their KV cache slots
  kAttention,    // attn = causal attention of each q head over its KV head's cached keys and values (the
                 // layer's sliding window, the config's scale and soft cap where it sets them)
  kOutProj,      // tmp = attn · W_oᵀ
  kSumRanks,     // tmp = its sum over the tensor-parallel ranks (nothing on one)
  kAttnOutNorm,  // tmp = rmsnorm(tmp) · attn_out_norm (Gemma's post-attention norm)
  kResidual,     // x += tmp
  kPostNorm,     // xn = rmsnorm(x) · post_norm (the norm before the MLP)
  kGateUpProj,   // gate_up = xn · [W_gate; W_up]ᵀ
  kSiluMul,      // act = silu(gate) · up
  kGeluTanhMul,  // act = gelu_tanh(gate) · up (GeGLU)
  kDownProj,     // tmp = act · W_downᵀ
  kMlpOutNorm,   // tmp = rmsnorm(tmp) · mlp_out_norm (Gemma's post-feed-forward norm)
};

// The op's name as logs and errors show it ("qk_norm").
const char* LayerOpName(LayerOp op);

struct Architecture {
  std::string_view name;                             // "llama", "qwen3"
  std::vector<std::string_view> hf_architectures;    // config.json "architectures"[0] values it serves
  std::vector<std::string_view> gguf_architectures;  // GGUF general.architecture values it serves
  bool qkv_bias = false;                             // q_proj, k_proj and v_proj have biases (Qwen2)
  bool qk_norm = false;                              // per-head q_norm and k_norm weights, [head_dim] (Qwen3)
  // GGUF files store q and k rows in llama.cpp's interleaved rotary order (its llama-family converter permutes
  // them); the loader turns them back into the rotate-half order.
  bool gguf_interleaved_rotary = false;
  // Norms multiply by 1 + weight (Gemma): Hugging Face checkpoints store the weight, GGUF files 1 + weight; the
  // loader hands every backend the multiplier.
  bool norms_add_one = false;
  // Norms around both halves of the layer (Gemma): attn_out_norm and mlp_out_norm on the halves' outputs, and
  // post_norm is the checkpoint's pre-feed-forward norm.
  bool sandwich_norms = false;
  bool scaled_embeddings = false;  // the embedding rows are multiplied by √hidden (Gemma)
  // Checkpoints store q/k/v as one self_attn.qkv_proj and gate/up as one mlp.gate_up_proj (Phi-3).
  bool fused_projections = false;
  // > 0: sliding-window layers interleaved with global ones (config.json's layer_types, else every
  // sliding_window_pattern-th layer global, this its default), with a rotary base of their own (this default).
  int32_t sliding_window_pattern = 0;
  double sliding_rope_theta = 0;
  std::vector<LayerOp> layer;  // one decoder layer, in order
};

// The family that serves a config.json architecture, or a GGUF general.architecture; null for none.
const Architecture* FindArchitecture(std::string_view hf_architecture);
const Architecture* FindGgufArchitecture(std::string_view gguf_architecture);
// Every served name, for error messages: "LlamaForCausalLM, MistralForCausalLM, …".
std::string SupportedArchitectures();
std::string SupportedGgufArchitectures();

// The families (engine/model/arch/*.cc).
const Architecture& LlamaArchitecture();   // Llama 2/3, Mistral, SmolLM
const Architecture& Qwen2Architecture();   // Qwen2, Qwen2.5
const Architecture& Qwen3Architecture();   // Qwen3 (dense)
const Architecture& Gemma3Architecture();  // Gemma 3 (text)
const Architecture& Phi3Architecture();    // Phi-3, Phi-3.5, Phi-4-mini

}  // namespace inferd

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
  kInputNorm,   // xn = rmsnorm(x) · input_norm
  kQkvProj,     // qkv = xn · W_qkvᵀ (+ the q/k/v bias where the family has one)
  kQkNorm,      // every q head and every k head of qkv: rmsnorm over head_dim · q_norm (k_norm)
  kRope,        // the rotary embedding on q and k
  kWriteKv,     // k and v into their KV cache slots
  kAttention,   // attn = causal attention of each q head over its KV head's cached keys and values
  kOutProj,     // tmp = attn · W_oᵀ
  kSumRanks,    // tmp = its sum over the tensor-parallel ranks (nothing on one)
  kResidual,    // x += tmp
  kPostNorm,    // xn = rmsnorm(x) · post_attention_norm
  kGateUpProj,  // gate_up = xn · [W_gate; W_up]ᵀ
  kSiluMul,     // act = silu(gate) · up
  kDownProj,    // tmp = act · W_downᵀ
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
  std::vector<LayerOp> layer;  // one decoder layer, in order
};

// The family that serves a config.json architecture, or a GGUF general.architecture; null for none.
const Architecture* FindArchitecture(std::string_view hf_architecture);
const Architecture* FindGgufArchitecture(std::string_view gguf_architecture);
// Every served name, for error messages: "LlamaForCausalLM, MistralForCausalLM, …".
std::string SupportedArchitectures();
std::string SupportedGgufArchitectures();

// The families (engine/model/arch/*.cc).
const Architecture& LlamaArchitecture();  // Llama 2/3, Mistral, SmolLM
const Architecture& Qwen2Architecture();  // Qwen2, Qwen2.5
const Architecture& Qwen3Architecture();  // Qwen3 (dense)

}  // namespace inferd

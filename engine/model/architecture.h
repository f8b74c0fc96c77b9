// A model family, written once: which config.json and GGUF architectures it answers to, the tensors its layers
// have beyond the common ones, and its decoder layer as a short program over a closed set of building blocks.
// Each backend implements each block once and runs a layer by walking the program (the cpu backend, the fp32
// reference, does; see docs/DESIGN.md for the cuda backend's part). One file per family in engine/model/arch/.
#pragma once

#include <cstdint>
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
  kMoe,          // tmp = Σ over the row's top-k experts of weight · down_e(silu(gate_e(xn)) · up_e(xn)), the
                 // weights the softmax of the router's logits xn · W_routerᵀ over all experts, taken at the top k
                 // and (ModelConfig::normalize_top_k) divided by their sum
};

// The op's name as logs and errors show it ("qk_norm").
const char* LayerOpName(LayerOp op);

// The tensors a decoder layer may have (LayerTensors' members, engine/model/model_tensors.h).
enum class LayerRole : uint8_t {
  kInputNorm,
  kQProj,
  kKProj,
  kVProj,
  kQBias,
  kKBias,
  kVBias,
  kQNorm,
  kKNorm,
  kOProj,
  kAttnOutNorm,
  kPostNorm,
  kGateProj,
  kUpProj,
  kDownProj,
  kMlpOutNorm,
  kRouter,      // [experts, hidden]: a mixture-of-experts layer's router
  kExpertGate,  // one expert's [moe_intermediate, hidden]
  kExpertUp,    // one expert's [moe_intermediate, hidden]
  kExpertDown,  // one expert's [hidden, moe_intermediate]
};

// The role's name as errors and tensor names show it ("q_proj").
const char* LayerRoleName(LayerRole role);

// A size a tensor's shape is made of, read from the model's config (ModelConfig): 1, hidden, the q and the k (or
// v) widths (heads × head dim), intermediate, head dim, the number of experts and an expert's intermediate.
enum class Dim : uint8_t { kOne, kHidden, kQ, kKv, kFf, kHeadDim, kExperts, kMoeFf };

// One tensor of a family's decoder layer: its name in a Hugging Face checkpoint (after "model.layers.N.") and in a
// GGUF file (after "blk.N."), its [rows, cols] as Hugging Face orders them (rows kOne: a vector), and the role it
// fills. Consecutive specs with the same names are the parts of one stored tensor, its rows in the order listed
// (Phi-3's qkv_proj: q, k and v), cut from it over the same bytes. An expert's tensors (roles kExpertGate, kExpertUp,
// kExpertDown) name each expert by "{e}" in their names.
// A GGUF file stacks a layer's experts in one 3-D tensor (llama.cpp's ffn_gate_exps: [experts, rows, cols]): an
// expert spec whose GGUF name has no "{e}" names it, each expert's rows a slice of it over the same bytes.
struct TensorSpec {
  std::string_view hf, gguf;
  Dim rows, cols;
  LayerRole role;
};

struct Architecture {
  std::string_view name;                             // "llama", "qwen3"
  std::vector<std::string_view> hf_architectures;    // config.json "architectures"[0] values it serves
  std::vector<std::string_view> gguf_architectures;  // GGUF general.architecture values it serves
  // GGUF files store q and k rows in llama.cpp's interleaved rotary order (its llama-family converter permutes
  // them); the loader turns them back into the rotate-half order.
  bool gguf_interleaved_rotary = false;
  // Norms multiply by 1 + weight (Gemma): Hugging Face checkpoints store the weight, GGUF files 1 + weight; the
  // loader hands every backend the multiplier.
  bool norms_add_one = false;
  bool scaled_embeddings = false;  // the embedding rows are multiplied by √hidden (Gemma)
  // > 0: sliding-window layers interleaved with global ones (config.json's layer_types, else every
  // sliding_window_pattern-th layer global, this its default), with a rotary base of their own (this default).
  // 0: the window layers rotate as the global ones (Gemma 2).
  int32_t sliding_window_pattern = 0;
  double sliding_rope_theta = 0;
  // Scores soft-capped by config.json's attn_logit_softcapping (Gemma 2). Other families leave the key unapplied, as
  // transformers does (its Gemma 3 reads it and never applies it); final_logit_softcapping applies to every family.
  bool attn_softcap = false;
  std::vector<TensorSpec> tensors;  // one decoder layer's, where the files keep them
  std::vector<LayerOp> layer;       // one decoder layer, in order
  // Mixture-of-experts families: `layer` is a sparse layer's program (with kMoe), `expert_tensors` its router and
  // experts (in place of the dense MLP's tensors), and `dense_layer` the program of the layers the config keeps
  // dense (ModelConfig::sparse_layers); both empty for a dense family.
  std::vector<TensorSpec> expert_tensors;
  std::vector<LayerOp> dense_layer;
  // Where config.json does not say (norm_topk_prob): whether the top k experts' weights are divided by their sum.
  bool normalize_top_k = true;

  // Whether the layer has a tensor of this role: q/k/v biases (Qwen2), per-head q/k norms (Qwen3, Gemma), norms on
  // the halves' outputs (Gemma's sandwich norms; its post_norm is then the checkpoint's pre-feed-forward norm).
  bool has(LayerRole role) const;
  bool qkv_bias() const { return has(LayerRole::kQBias); }
  bool qk_norm() const { return has(LayerRole::kQNorm); }
  bool sandwich_norms() const { return has(LayerRole::kAttnOutNorm); }
};

// Llama's layer tensors (q, k, v and o; gate, up and down; the two norms), which the other families edit.
std::vector<TensorSpec> LlamaTensors();
// Per-head q and k norms over head_dim (Qwen3, Gemma 3).
std::vector<TensorSpec> QkNormTensors();
// A sparse layer's router and experts under their Hugging Face names (each expert's with "{e}"); in GGUF files
// llama.cpp's names: ffn_gate_inp, and the experts stacked in ffn_gate_exps, ffn_up_exps and ffn_down_exps.
std::vector<TensorSpec> MoeTensors(std::string_view router, std::string_view gate, std::string_view up,
                                   std::string_view down);
// `specs` without the dense MLP's tensors (gate, up, down): a mixture-of-experts family's sparse layers.
std::vector<TensorSpec> WithoutDenseMlp(std::vector<TensorSpec> specs);
// Whether a role is an expert's (named per expert).
bool IsExpertRole(LayerRole role);
// `specs` with `added` after the spec of role `after`.
std::vector<TensorSpec> InsertAfter(std::vector<TensorSpec> specs, LayerRole after, std::vector<TensorSpec> added);
// `specs` with the spec of `role` found under other names.
std::vector<TensorSpec> Rename(std::vector<TensorSpec> specs, LayerRole role, std::string_view hf,
                               std::string_view gguf);

// The family that serves a config.json architecture, or a GGUF general.architecture (one name may serve a dense
// family and a mixture: llama.cpp writes Mixtral as "llama" with experts); null for none.
const Architecture* FindArchitecture(std::string_view hf_architecture);
const Architecture* FindGgufArchitecture(std::string_view gguf_architecture, bool experts = false);
// Every served name, for error messages: "LlamaForCausalLM, MistralForCausalLM, …".
std::string SupportedArchitectures();
std::string SupportedGgufArchitectures();

// The families (engine/model/arch/*.cc).
const Architecture& LlamaArchitecture();     // Llama 2/3, Mistral, SmolLM
const Architecture& Qwen2Architecture();     // Qwen2, Qwen2.5
const Architecture& Qwen3Architecture();     // Qwen3 (dense)
const Architecture& Gemma2Architecture();    // Gemma 2
const Architecture& Gemma3Architecture();    // Gemma 3 (text)
const Architecture& Phi3Architecture();      // Phi-3, Phi-3.5, Phi-4-mini
const Architecture& MixtralArchitecture();   // Mixtral (mixture of experts)
const Architecture& Qwen3MoeArchitecture();  // Qwen3-MoE

}  // namespace inferd

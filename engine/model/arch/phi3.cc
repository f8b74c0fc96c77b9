// Phi-3, Phi-3.5 and Phi-4-mini: Llama's layer over checkpoints that fuse q/k/v into qkv_proj and gate/up into
// gate_up_proj (split into their parts at load, over the same bytes), with LongRoPE and partial rotary from the
// config.
#include "engine/model/architecture.h"

namespace inferd {

namespace {

// Llama's tensors, q/k/v read from one qkv_proj (q, k, then v rows) and gate/up from one gate_up_proj (GGUF's
// ffn_up holds gate, then up).
std::vector<TensorSpec> Phi3Tensors() {
  using enum LayerRole;
  std::vector<TensorSpec> t = LlamaTensors();
  for (LayerRole part : {kQProj, kKProj, kVProj}) t = Rename(t, part, "self_attn.qkv_proj.weight", "attn_qkv.weight");
  for (LayerRole part : {kGateProj, kUpProj}) t = Rename(t, part, "mlp.gate_up_proj.weight", "ffn_up.weight");
  return t;
}

}  // namespace

const Architecture& Phi3Architecture() {
  static const Architecture arch{
      .name = "phi3",
      .hf_architectures = {"Phi3ForCausalLM"},
      .gguf_architectures = {"phi3"},
      .tensors = Phi3Tensors(),
      .layer = LlamaArchitecture().layer,
  };
  return arch;
}

}  // namespace inferd

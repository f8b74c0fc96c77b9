// Phi-3, Phi-3.5 and Phi-4-mini: Llama's layer over checkpoints that fuse q/k/v into qkv_proj and gate/up into
// gate_up_proj (split into their parts at load, over the same bytes), with LongRoPE and partial rotary from the
// config.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& Phi3Architecture() {
  static const Architecture arch{
      .name = "phi3",
      .hf_architectures = {"Phi3ForCausalLM"},
      .gguf_architectures = {"phi3"},
      .fused_projections = true,
      .layer = LlamaArchitecture().layer,
  };
  return arch;
}

}  // namespace inferd

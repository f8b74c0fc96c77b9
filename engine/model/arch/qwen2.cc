// Qwen2 (and Qwen2.5): Llama's layer with biases on q, k and v.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& Qwen2Architecture() {
  static const Architecture arch{
      .name = "qwen2",
      .hf_architectures = {"Qwen2ForCausalLM"},
      .gguf_architectures = {"qwen2"},
      .tensors = InsertAfter(LlamaTensors(), LayerRole::kVProj,
                             {{"self_attn.q_proj.bias", "attn_q.bias", Dim::kOne, Dim::kQ, LayerRole::kQBias},
                              {"self_attn.k_proj.bias", "attn_k.bias", Dim::kOne, Dim::kKv, LayerRole::kKBias},
                              {"self_attn.v_proj.bias", "attn_v.bias", Dim::kOne, Dim::kKv, LayerRole::kVBias}}),
      .layer = LlamaArchitecture().layer,
  };
  return arch;
}

}  // namespace inferd

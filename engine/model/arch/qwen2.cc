// Qwen2 (and Qwen2.5): Llama's layer with biases on q, k and v.
#include "engine/model/architecture.h"

namespace inferd {

const Architecture& Qwen2Architecture() {
  static const Architecture arch{
      .name = "qwen2",
      .hf_architectures = {"Qwen2ForCausalLM"},
      .gguf_architectures = {"qwen2"},
      .qkv_bias = true,
      .layer = LlamaArchitecture().layer,
  };
  return arch;
}

}  // namespace inferd

// A decoder's shape and its family (engine/model/architecture.h), read from a Hugging Face config.json.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/architecture.h"
#include "engine/model/quantization_config.h"

namespace inferd {

struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";     // default | llama3 | linear | factors | longrope
  std::vector<float> freq_factors;  // factors: per-frequency divisors (GGUF rope_freqs.weight)
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int32_t original_max_position_embeddings = 8192;  // llama3, longrope
  // longrope (Phi-3): per-frequency divisors for positions below original_max_position_embeddings (short) and
  // from it on (long), and the multiplier of cos and sin.
  std::vector<float> short_factor, long_factor;
  double attention_factor = 1.0;
};

struct ModelConfig {
  std::string architecture;                         // config.json's, e.g. Qwen3ForCausalLM
  const Architecture* arch = &LlamaArchitecture();  // its family: tensors and layer program
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // the leading dimensions of each head the rotary embedding turns (partial_rotary_factor)
  int32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  RopeConfig rope;
  // Gemma's attention options (the defaults are every other family's): per layer the sliding window in tokens
  // (empty, or 0 for a layer: global attention), the sliding layers' rotary base, the softmax scale (0:
  // 1/√head_dim), soft caps on attention scores and final logits (0: none).
  std::vector<int32_t> layer_window;
  double rope_local_theta = 0;
  double attention_scale = 0;
  double attn_logit_softcap = 0;
  double final_logit_softcap = 0;
  // A mixture of experts (Mixtral, Qwen3-MoE; 0 experts: a dense model): experts per sparse layer, how many each
  // token takes, an expert's intermediate width, whether the top k's weights are divided by their sum, and which
  // layers are sparse (empty: none).
  int32_t num_experts = 0;
  int32_t experts_per_token = 0;
  int32_t moe_intermediate_size = 0;
  bool normalize_top_k = true;
  std::vector<bool> sparse_layers;
  std::string torch_dtype;          // as stated in config.json, informational
  QuantizationConfig quantization;  // an FP8 checkpoint's quantization_config
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  // Widths derived from the heads: one query row, one K (or V) row, and the fused q/k/v row.
  int64_t q_width() const { return int64_t{num_heads} * head_dim; }
  int64_t kv_width() const { return int64_t{num_kv_heads} * head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
  int32_t window(int layer) const { return layer_window.empty() ? 0 : layer_window[layer]; }
  // Whether a layer attends through a sliding window (a config may list every layer global).
  bool has_windows() const { return sliding_window() != 0; }
  // The window of the layers that have one: 0 for none, -1 where they differ.
  int32_t sliding_window() const {
    int32_t window = 0;
    for (int32_t w : layer_window) {
      if (w > 0 && window > 0 && w != window) return -1;
      if (w > 0) window = w;
    }
    return window;
  }
  bool sparse(int layer) const { return !sparse_layers.empty() && sparse_layers[layer]; }
  int32_t num_sparse_layers() const {
    return static_cast<int32_t>(std::count(sparse_layers.begin(), sparse_layers.end(), true));
  }
  bool has_experts() const { return num_experts > 0; }
  // The program of a layer: a sparse layer's (with kMoe), or the family's dense layer where it has one.
  const std::vector<LayerOp>& program(int layer) const {
    return !sparse(layer) && !arch->dense_layer.empty() ? arch->dense_layer : arch->layer;
  }
  // The embedding rows' multiplier: √hidden for families that scale them (Gemma), else 1.
  double embedding_scale() const { return arch->scaled_embeddings ? std::sqrt(double(hidden_size)) : 1.0; }
};

// Parses config.json text; a missing or inconsistent field is an error naming it.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);

// The inverse frequencies of the rotary embedding, [rotary_dim / 2], with rope scaling applied; `local`: those of
// the sliding-window layers (rope_local_theta, unscaled) where the config sets them; `long_positions`: longrope's
// for positions from original_max_position_embeddings on.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config, bool local = false, bool long_positions = false);

// Every `pattern`-th layer global, the others attending through `window` tokens (the family's default pattern
// where a file gives no layer types).
void SetWindowPattern(ModelConfig* config, int32_t window, int32_t pattern);

// LongRoPE's multiplier of cos and sin where a file gives none: √(1 + ln(max / original) / ln(original)), 1 where
// max <= original.
double LongRopeAttentionFactor(double max_positions, double original_positions);

}  // namespace inferd

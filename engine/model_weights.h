// Llama-family weights in fp32, loaded from a Hugging Face directory, with q/k/v and gate/up fused.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace inferd {

// A row-major matrix [rows, cols] (a vector when rows == 1).
struct Matrix {
  std::vector<float> data;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Stacks matrices with equal column counts row-wise (q, k, v into qkv; gate, up into gate_up).
Matrix StackRows(std::initializer_list<const Matrix*> parts);
// Joins vectors end to end (the q, k and v biases).
Matrix ConcatVectors(std::initializer_list<const Matrix*> parts);

struct LayerWeights {
  Matrix input_norm;  // [1, hidden]
  Matrix qkv;         // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
  Matrix qkv_bias;    // [1, (num_heads + 2 * num_kv_heads) * head_dim], empty without QKV bias
  Matrix o;           // [hidden, num_heads * head_dim]
  Matrix post_norm;   // [1, hidden]
  Matrix gate_up;     // [2 * intermediate, hidden]: gate rows then up rows
  Matrix down;        // [hidden, intermediate]
};

struct ModelWeights {
  Matrix embed;       // [vocab, hidden]
  Matrix final_norm;  // [1, hidden]
  Matrix lm_head;     // [vocab, hidden]; a copy of embed when embeddings are tied
  std::vector<LayerWeights> layers;
  std::string stored_dtype;  // dtype of the weights in the files
};

// Loads model.safetensors or the shards listed in model.safetensors.index.json, checking every tensor's
// presence and shape against the config.
absl::StatusOr<ModelWeights> LoadHfWeights(const std::string& dir, const ModelConfig& config);

}  // namespace inferd

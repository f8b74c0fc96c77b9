// A description of a Llama-family model's weights: for every tensor, where its bytes lie in the
// memory-mapped model files and how they are encoded. Nothing is converted at load; each backend builds its
// own weights from this (fp32 on the host for cpu, bf16/fp16 on the device for cuda).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/formats/safetensors.h"
#include "engine/model/model_config.h"

namespace inferd {

struct TensorDesc {
  std::string name;                // as the file names it
  int64_t rows = 0;                // logical row-major shape [rows, cols]; rows = 1 for a vector
  int64_t cols = 0;                // rows = 0: the tensor is absent
  std::span<const uint8_t> bytes;  // the stored elements, inside a mapped file
  bool ggml = false;               // false: row-major `dtype` elements; true: rows of ggml blocks of ggml_type
  DType dtype = DType::kF32;
  uint32_t ggml_type = 0;
  // > 0: GGUF stores each head's rows (rows / rotary_heads of them) in llama.cpp's interleaved rotary order;
  // DecodeRows returns them in the Hugging Face (rotate-half) order the forward pass uses.
  int32_t rotary_heads = 0;
  // F8_E4M3 tensors: the checkpoint's weight_scale, one per row or one for the whole tensor; a value is the
  // e4m3 element times its scale (DecodeRows applies it).
  std::vector<float> scales;
  // model.load_format dummy: no bytes; element (r, c) is kernels::RandomWeight(random_seed, r, c, random_mean,
  // random_std), made where it is used (the cuda upload fills each shard on its device).
  uint64_t random_seed = 0;
  float random_mean = 0, random_std = 0;
  // Added to every element as it is decoded: 1 for a norm a checkpoint stores as w when the family multiplies by
  // 1 + w (Architecture::norms_add_one), so that every backend holds the multiplier.
  float add = 0;
  // > 0: the heads of this tensor are padded with zeros for attention kernels that do not run its head dim
  // (engine/model/head_padding.h): every head_stored rows (columns, with pad_columns) of the stored tensor are
  // followed by head_padded − head_stored zero rows (columns). rows and cols are the padded shape; DecodeRows
  // returns it.
  int32_t head_stored = 0, head_padded = 0;
  bool pad_columns = false;

  bool present() const { return rows > 0; }
  bool padded() const { return head_padded > 0; }
  bool random() const { return random_seed != 0; }
  int64_t numel() const { return rows * cols; }
};

struct LayerTensors {
  TensorDesc input_norm;              // [1, hidden]
  TensorDesc q_proj, k_proj, v_proj;  // [heads * head_dim, hidden], [kv_heads * head_dim, hidden] x2
  TensorDesc q_bias, k_bias, v_bias;  // [1, ...]; absent without QKV bias
  TensorDesc q_norm, k_norm;          // [1, head_dim]: per-head norms (Architecture::qk_norm); else absent
  TensorDesc attn_out_norm;           // [1, hidden]: on the attention output (Architecture::sandwich_norms)
  TensorDesc mlp_out_norm;            // [1, hidden]: on the MLP output (Architecture::sandwich_norms)
  TensorDesc o_proj;                  // [hidden, heads * head_dim]
  TensorDesc post_norm;               // [1, hidden]: the norm before the MLP
  TensorDesc gate_proj, up_proj;      // [intermediate, hidden]
  TensorDesc down_proj;               // [hidden, intermediate]
  // A mixture-of-experts layer's (ModelConfig::sparse) router [experts, hidden] and experts, in place of the dense
  // MLP's gate, up and down.
  struct Expert {
    TensorDesc gate, up;  // [moe_intermediate, hidden]
    TensorDesc down;      // [hidden, moe_intermediate]
  };
  TensorDesc router;
  std::vector<Expert> experts;
  // An 8-bit float KV cache's per-tensor scales from the checkpoint (self_attn.k_scale, v_scale): the cache
  // holds K / k_cache_scale and V / v_cache_scale. 1 when the checkpoint has none.
  float k_cache_scale = 1.f, v_cache_scale = 1.f;
};

struct ModelTensors {
  TensorDesc embed;       // [vocab, hidden]
  TensorDesc final_norm;  // [1, hidden]
  TensorDesc lm_head;     // [vocab, hidden]; absent when the embeddings are tied
  std::vector<LayerTensors> layers;
  std::string stored_dtype;                        // dtype of most weights in the files ("bfloat16", "Q4_K", ...)
  bool fp8_checkpoint = false;                     // the layers' linear weights are stored F8_E4M3 (scaled)
  bool kv_cache_scales = false;                    // every layer has the checkpoint's k_scale and v_scale
  std::vector<std::shared_ptr<const void>> files;  // the mapped files the byte spans point into
};

// Every tensor of the model, present or not (embedding, final norm, LM head, then each layer's).
std::vector<TensorDesc*> AllTensors(ModelTensors* tensors);
std::vector<const TensorDesc*> AllTensors(const ModelTensors& tensors);

// Drops the tensors' bytes once a backend has built its own weights and hands over the mapped files: dropping
// those unmaps them, whose pages would otherwise stay resident (and count against a container's memory limit)
// for the server's whole life. Shapes and names stay; a tensor's bytes are empty after.
[[nodiscard]] std::vector<std::shared_ptr<const void>> ReleaseTensorBytes(ModelTensors* tensors);

// Decodes rows [first, first + count) of a tensor to fp32 into out[count, cols].
absl::Status DecodeRows(const TensorDesc& tensor, int64_t first, int64_t count, float* out);

// How the stored bytes hold a tensor's rows (before padding, scales or `add`): the bytes of one row, checked
// against the tensor's size (whole ggml blocks), and which stored row holds logical row r (GGUF's rotary order).
absl::StatusOr<int64_t> StoredRowBytes(const TensorDesc& tensor);
int64_t StoredRow(const TensorDesc& tensor, int64_t r);

// Rows [first, first + count) of a tensor as a tensor of their own, over the same bytes: the parts of a
// checkpoint's fused projection (Phi-3's qkv_proj, gate_up_proj). Not for GGUF rows in llama.cpp's rotary order.
absl::StatusOr<TensorDesc> RowsOf(const TensorDesc& tensor, int64_t first, int64_t count, std::string name);

// The member of `layer` that holds tensors of this role (an expert's role: expert `expert`'s, which must exist).
TensorDesc& RoleOf(LayerTensors& layer, LayerRole role, int32_t expert = 0);
const TensorDesc& RoleOf(const LayerTensors& layer, LayerRole role, int32_t expert = 0);

// The size a tensor spec's Dim names in this config.
int64_t DimOf(const ModelConfig& config, Dim dim);

// Reads one stored tensor: its full name and its shape as Hugging Face orders it ([n] for a vector, [rows, cols]
// otherwise).
using DescribeTensor =
    std::function<absl::Status(const std::string& name, const std::vector<int64_t>& shape, TensorDesc*)>;

// Describes decoder layer `index`'s tensors by its family's specs (Architecture::tensors; a sparse layer's without
// the dense MLP's and with Architecture::expert_tensors, each expert's under its number), each stored tensor read
// once through `describe` under `prefix` ("model.layers.3." or "blk.3."), by its Hugging Face names or (gguf) its
// GGUF names; the parts of a fused stored tensor are cut from it over the same bytes.
absl::Status DescribeLayer(const ModelConfig& config, bool gguf, int32_t index, const std::string& prefix,
                           const DescribeTensor& describe, LayerTensors* layer);

// Describes model.safetensors or the shards listed in model.safetensors.index.json, checking every tensor's
// presence and shape against the config. `random`: no weight files are read; every tensor the config implies is
// random (TensorDesc::random_seed), stored as `random_dtype`.
absl::StatusOr<ModelTensors> DescribeHfTensors(const std::string& dir, const ModelConfig& config, bool random = false,
                                               DType random_dtype = DType::kBF16);

}  // namespace inferd

#include "engine/model/formats/gguf_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace inferd {
namespace {

constexpr int64_t kMaxDim = 1 << 20;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("gguf: ", what));
}

// An integer metadata value in [lo, hi]; `fallback` when absent and optional.
absl::StatusOr<int64_t> GetInt(const GgufContents& g, const std::string& key, int64_t lo, int64_t hi,
                               std::optional<int64_t> fallback = std::nullopt) {
  const GgufValue* v = g.Find(key);
  if (!v) {
    if (fallback) return *fallback;
    return Bad(absl::StrCat("metadata '", key, "' is missing"));
  }
  if (!v->is_integer())
    return Bad(absl::StrCat("metadata '", key, "' is a ", GgufTypeName(v->type), ", not an integer"));
  if (v->i < lo || v->i > hi)
    return Bad(absl::StrCat("metadata '", key, "' = ", v->i, " is outside [", lo, ", ", hi, "]"));
  return v->i;
}

absl::StatusOr<double> GetFloat(const GgufContents& g, const std::string& key, double fallback) {
  const GgufValue* v = g.Find(key);
  if (!v) return fallback;
  if (!v->is_number()) return Bad(absl::StrCat("metadata '", key, "' is a ", GgufTypeName(v->type), ", not a number"));
  const double x = v->is_integer() ? static_cast<double>(v->i) : v->f;
  if (!(x > 0) || !std::isfinite(x)) return Bad(absl::StrCat("metadata '", key, "' = ", x, " must be positive"));
  return x;
}

std::string Shape(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Describes a tensor whose ggml dims are `dims` (innermost first) as a row-major [rows, cols] tensor.
absl::Status Describe(const GgufFile& f, const std::string& name, std::vector<int64_t> dims, TensorDesc* out,
                      std::map<std::string, int>* type_counts) {
  const GgufTensor* t = f.contents().FindTensor(name);
  if (!t) return Bad(absl::StrCat("missing tensor '", name, "'"));
  if (t->dims != dims) {
    return Bad(absl::StrCat("tensor '", name, "' has dims ", Shape(t->dims), " but the metadata needs ", Shape(dims)));
  }
  int64_t block_elems = 0, block_bytes = 0;
  if (!GgmlBlockLayout(t->type, &block_elems, &block_bytes)) {
    return Bad(absl::StrCat("tensor '", name, "' has type ", GgmlTypeName(t->type), ", which inferd does not read"));
  }
  if (dims[0] % block_elems != 0) {
    return Bad(absl::StrCat("tensor '", name, "': rows of ", dims[0], " elements are not whole ", GgmlTypeName(t->type),
                            " blocks of ", block_elems));
  }
  out->name = name;
  out->cols = dims[0];
  out->rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) out->rows *= dims[i];  // [experts, rows, cols]: experts × rows rows
  out->ggml = true;
  out->ggml_type = t->type;
  out->bytes = f.Bytes(*t);
  ++(*type_counts)[GgmlTypeName(t->type)];
  return absl::OkStatus();
}

// A mixture's experts as llama.cpp writes them: expert_count, expert_used_count, expert_feed_forward_length (else
// feed_forward_length), expert_weights_norm (whether the top k weights are divided by their sum; llama.cpp's
// Mixtral and Qwen3-MoE do); a layer is sparse where it has a router (ffn_gate_inp), as llama.cpp decides it.
absl::Status ReadExperts(const GgufContents& g, const std::string& p, int64_t experts, ModelConfig* c) {
  c->num_experts = static_cast<int32_t>(experts);
  INFERD_ASSIGN_OR_RETURN(c->experts_per_token, GetInt(g, p + "expert_used_count", 1, experts));
  INFERD_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                          GetInt(g, p + "expert_feed_forward_length", 1, kMaxDim, c->intermediate_size));
  c->normalize_top_k = true;
  if (const GgufValue* v = g.Find(p + "expert_weights_norm")) {
    if (v->type != GgufType::kBool) {
      return Bad(absl::StrCat("metadata '", p, "expert_weights_norm' is a ", GgufTypeName(v->type), ", not a bool"));
    }
    c->normalize_top_k = v->i != 0;
  }
  c->sparse_layers.assign(c->num_layers, false);
  for (int32_t l = 0; l < c->num_layers; ++l) {
    c->sparse_layers[l] = g.FindTensor(absl::StrCat("blk.", l, ".ffn_gate_inp.weight")) != nullptr;
  }
  if (std::find(c->sparse_layers.begin(), c->sparse_layers.end(), true) == c->sparse_layers.end()) {
    return Bad(absl::StrCat(p, "expert_count = ", experts, " but no layer has a router (blk.N.ffn_gate_inp.weight)"));
  }
  if (c->arch->dense_layer.empty() &&
      std::find(c->sparse_layers.begin(), c->sparse_layers.end(), false) != c->sparse_layers.end()) {
    return Bad(absl::StrCat(c->architecture, " has no dense layers, but a layer of this file has no router"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string GgufString(const GgufContents& g, std::string_view key) {
  const GgufValue* v = g.Find(key);
  return v && v->type == GgufType::kString ? v->s : "";
}

absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file) {
  const GgufContents& g = file.contents();
  const std::string arch = GgufString(g, "general.architecture");
  ModelConfig c;
  const std::string p = arch + ".";
  // A mixture of experts (Mixtral's files are "llama" with experts, Qwen3-MoE's "qwen3moe"), stacked in 3-D tensors.
  INFERD_ASSIGN_OR_RETURN(const int64_t experts, GetInt(g, p + "expert_count", 0, 4096, 0));
  c.arch = FindGgufArchitecture(arch, experts > 0);
  if (!c.arch) {
    return Bad(absl::StrCat("general.architecture '", arch.substr(0, 80), "'", experts > 0 ? " with experts" : "",
                            " is not supported; supported: ", SupportedGgufArchitectures()));
  }
  c.architecture = std::string(c.arch->hf_architectures.front());
  INFERD_ASSIGN_OR_RETURN(c.num_layers, GetInt(g, p + "block_count", 1, 4096));
  INFERD_ASSIGN_OR_RETURN(c.hidden_size, GetInt(g, p + "embedding_length", 1, kMaxDim));
  INFERD_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(g, p + "feed_forward_length", 1, kMaxDim));
  INFERD_ASSIGN_OR_RETURN(c.num_heads, GetInt(g, p + "attention.head_count", 1, 4096));
  INFERD_ASSIGN_OR_RETURN(c.num_kv_heads, GetInt(g, p + "attention.head_count_kv", 1, c.num_heads, c.num_heads));
  if (c.num_heads % c.num_kv_heads != 0) {
    return Bad(
        absl::StrCat(p, "attention.head_count ", c.num_heads, " is not a multiple of head_count_kv ", c.num_kv_heads));
  }
  INFERD_ASSIGN_OR_RETURN(c.head_dim, GetInt(g, p + "attention.key_length", 2, 1024, c.hidden_size / c.num_heads));
  if (c.head_dim % 2 != 0) return Bad(absl::StrCat("head dimension ", c.head_dim, " is odd"));
  INFERD_ASSIGN_OR_RETURN(int64_t rope_dims, GetInt(g, p + "rope.dimension_count", 2, 1024, c.head_dim));
  if (rope_dims > c.head_dim || rope_dims % 2 != 0) {
    return Bad(absl::StrCat(p, "rope.dimension_count ", rope_dims, " is not an even number up to the head dimension ",
                            c.head_dim));
  }
  c.rotary_dim = static_cast<int32_t>(rope_dims);
  INFERD_ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(g, p + "context_length", 1, 1 << 24));
  INFERD_ASSIGN_OR_RETURN(c.rms_norm_eps, GetFloat(g, p + "attention.layer_norm_rms_epsilon", 1e-5));
  INFERD_ASSIGN_OR_RETURN(c.rope.theta, GetFloat(g, p + "rope.freq_base", 10000.0));
  const std::string scaling = GgufString(g, p + "rope.scaling.type");
  if (scaling == "linear") {
    c.rope.type = "linear";
    INFERD_ASSIGN_OR_RETURN(c.rope.factor, GetFloat(g, p + "rope.scaling.factor", 1.0));
  } else if (!scaling.empty() && scaling != "none") {
    return Bad(absl::StrCat(p, "rope.scaling.type '", scaling, "' is not supported; supported: none, linear"));
  }
  const GgufValue* tokens = g.Find("tokenizer.ggml.tokens");
  const int64_t n_tokens = tokens ? static_cast<int64_t>(tokens->strings.size()) : 0;
  INFERD_ASSIGN_OR_RETURN(c.vocab_size, GetInt(g, p + "vocab_size", 1, 1 << 24, n_tokens));
  if (c.vocab_size < 1) return Bad("the vocabulary is empty (no tokenizer.ggml.tokens)");
  c.tie_word_embeddings = g.FindTensor("output.weight") == nullptr;
  if (const GgufTensor* f = g.FindTensor("rope_freqs.weight")) {  // llama 3.x rope scaling, precomputed
    if (f->dims != std::vector<int64_t>{c.head_dim / 2} || f->type != static_cast<uint32_t>(GgmlType::kF32)) {
      return Bad(absl::StrCat("tensor 'rope_freqs.weight' must be F32 of dims [", c.head_dim / 2, "]"));
    }
    c.rope.type = "factors";
    c.rope.freq_factors.resize(c.head_dim / 2);
    INFERD_RETURN_IF_ERROR(DequantizeGgml(f->type, file.Bytes(*f), f->numel, c.rope.freq_factors.data()));
    for (float x : c.rope.freq_factors) {
      if (!(x > 0) || !std::isfinite(x)) return Bad("tensor 'rope_freqs.weight' holds a non-positive factor");
    }
  }
  // As llama.cpp runs Gemma 3: the family's window pattern and sliding base, the softmax scale 1/√head_dim.
  if (c.arch->sliding_window_pattern > 0) {
    INFERD_ASSIGN_OR_RETURN(const int64_t window, GetInt(g, p + "attention.sliding_window", 1, 1 << 24, 0));
    if (window > 0) SetWindowPattern(&c, static_cast<int32_t>(window), c.arch->sliding_window_pattern);
    c.rope_local_theta = c.arch->sliding_rope_theta;
  }
  // LongRoPE (phi3): the factors as tensors, the original context and cos/sin multiplier as keys.
  const GgufTensor* long_factors = g.FindTensor("rope_factors_long.weight");
  const GgufTensor* short_factors = g.FindTensor("rope_factors_short.weight");
  if (long_factors || short_factors) {
    for (auto [t, out] :
         {std::pair{long_factors, &c.rope.long_factor}, std::pair{short_factors, &c.rope.short_factor}}) {
      if (!t || t->dims != std::vector<int64_t>{rope_dims / 2} || t->type != static_cast<uint32_t>(GgmlType::kF32)) {
        return Bad(
            absl::StrCat("tensors 'rope_factors_long.weight' and 'rope_factors_short.weight' must both be F32 "
                         "of dims [",
                         rope_dims / 2, "]"));
      }
      out->resize(rope_dims / 2);
      INFERD_RETURN_IF_ERROR(DequantizeGgml(t->type, file.Bytes(*t), t->numel, out->data()));
      for (float x : *out) {
        if (!(x > 0) || !std::isfinite(x)) return Bad("a longrope factor is not a finite value > 0");
      }
    }
    c.rope.type = "longrope";
    INFERD_ASSIGN_OR_RETURN(c.rope.original_max_position_embeddings,
                            GetInt(g, p + "rope.scaling.original_context_length", 2, 1 << 24));
    INFERD_ASSIGN_OR_RETURN(
        c.rope.attention_factor,
        GetFloat(g, p + "rope.scaling.attn_factor",
                 LongRopeAttentionFactor(c.max_position_embeddings, c.rope.original_max_position_embeddings)));
  }
  if (experts > 0) INFERD_RETURN_IF_ERROR(ReadExperts(g, p, experts, &c));
  c.torch_dtype = "gguf";
  if (const GgufValue* v = g.Find("tokenizer.ggml.eos_token_id"); v && v->is_integer()) {
    c.eos_token_ids.push_back(static_cast<int32_t>(v->i));
  }
  if (const GgufValue* v = g.Find("tokenizer.ggml.eot_token_id"); v && v->is_integer()) {
    c.eos_token_ids.push_back(static_cast<int32_t>(v->i));
  }
  if (const GgufValue* v = g.Find("tokenizer.ggml.bos_token_id"); v && v->is_integer()) {
    c.bos_token_id = static_cast<int32_t>(v->i);
  }
  return c;
}

absl::StatusOr<ModelTensors> DescribeGgufTensors(std::shared_ptr<const GgufFile> file, const ModelConfig& c) {
  const GgufFile& f = *file;
  ModelTensors w;
  std::map<std::string, int> types;
  const int64_t h = c.hidden_size;
  INFERD_RETURN_IF_ERROR(Describe(f, "token_embd.weight", {h, c.vocab_size}, &w.embed, &types));
  INFERD_RETURN_IF_ERROR(Describe(f, "output_norm.weight", {h}, &w.final_norm, &types));
  if (!c.tie_word_embeddings) {
    INFERD_RETURN_IF_ERROR(Describe(f, "output.weight", {h, c.vocab_size}, &w.lm_head, &types));
  }
  w.layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerTensors& L = w.layers[l];
    // ggml orders a tensor's dims innermost first: [cols, rows].
    INFERD_RETURN_IF_ERROR(DescribeLayer(
        c, /*gguf=*/true, l, p,
        [&](const std::string& name, const std::vector<int64_t>& shape, TensorDesc* out) {
          return Describe(f, name, {shape.rbegin(), shape.rend()}, out, &types);
        },
        &L));
    if (c.arch->gguf_interleaved_rotary) {
      L.q_proj.rotary_heads = c.num_heads;
      L.k_proj.rotary_heads = c.num_kv_heads;
    }
  }
  // Name the file's weights by their most common type (norms are F32 in every quantized file).
  w.stored_dtype =
      std::max_element(types.begin(), types.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  w.files.push_back(std::move(file));
  return w;
}

}  // namespace inferd

#include "engine/model_weights.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

namespace fs = std::filesystem;

class TensorSource {
 public:
  absl::Status Open(const std::string& dir) {
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (fs::exists(index)) {
      std::ifstream in(index);
      std::stringstream ss;
      ss << in.rdbuf();
      auto j = nlohmann::json::parse(ss.str(), nullptr, false);
      if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(index.string(), ": missing 'weight_map'"));
      }
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) return absl::InvalidArgumentError(absl::StrCat(index.string(), ": bad entry"));
        const std::string shard = it.value().get<std::string>();
        if (shard.find('/') != std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat(index.string(), ": shard '", shard, "' is not a file name"));
        }
        if (!files_.count(shard)) {
          INFERD_ASSIGN_OR_RETURN(files_[shard], SafetensorsFile::Open((fs::path(dir) / shard).string()));
        }
        const SafetensorsFile* f = files_[shard].get();
        if (!f->tensors().count(it.key())) {
          return absl::InvalidArgumentError(
              absl::StrCat(index.string(), ": '", it.key(), "' is not in shard '", shard, "'"));
        }
        where_[it.key()] = f;
      }
    } else if (fs::exists(single)) {
      INFERD_ASSIGN_OR_RETURN(files_["model.safetensors"], SafetensorsFile::Open(single.string()));
      for (const auto& [name, info] : files_["model.safetensors"]->tensors())
        where_[name] = files_["model.safetensors"].get();
    } else {
      return absl::NotFoundError(
          absl::StrCat("model directory '", dir, "' has neither model.safetensors nor model.safetensors.index.json"));
    }
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const { return where_.count(name) > 0; }

  absl::Status Read(const std::string& name, std::vector<int64_t> shape, Matrix* out) {
    auto it = where_.find(name);
    if (it == where_.end()) return absl::InvalidArgumentError(absl::StrCat("weights: missing tensor '", name, "'"));
    const TensorInfo& info = it->second->tensors().at(name);
    if (info.shape != shape) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor '", name, "' has shape ", str(info.shape),
                                                     " but the config needs ", str(shape)));
    }
    dtype_ = DTypeName(info.dtype);
    out->rows = shape.size() == 2 ? shape[0] : 1;
    out->cols = shape.back();
    out->data.resize(out->rows * out->cols);
    ConvertToF32(info.dtype, it->second->Bytes(info), out->data.data());
    return absl::OkStatus();
  }

  const std::string& dtype() const { return dtype_; }

 private:
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::string dtype_;
};

}  // namespace

Matrix StackRows(std::initializer_list<const Matrix*> parts) {
  Matrix m;
  m.cols = (*parts.begin())->cols;
  for (const Matrix* p : parts) {
    m.data.insert(m.data.end(), p->data.begin(), p->data.end());
    m.rows += p->rows;
  }
  return m;
}

Matrix ConcatVectors(std::initializer_list<const Matrix*> parts) {
  Matrix m;
  m.rows = 1;
  for (const Matrix* p : parts) {
    m.data.insert(m.data.end(), p->data.begin(), p->data.end());
    m.cols += p->cols;
  }
  return m;
}

absl::StatusOr<ModelWeights> LoadHfWeights(const std::string& dir, const ModelConfig& c) {
  TensorSource src;
  INFERD_RETURN_IF_ERROR(src.Open(dir));
  ModelWeights w;
  const int64_t h = c.hidden_size, q_dim = int64_t{c.num_heads} * c.head_dim,
                kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  INFERD_RETURN_IF_ERROR(src.Read("model.embed_tokens.weight", {c.vocab_size, h}, &w.embed));
  INFERD_RETURN_IF_ERROR(src.Read("model.norm.weight", {h}, &w.final_norm));
  if (src.Has("lm_head.weight")) {
    INFERD_RETURN_IF_ERROR(src.Read("lm_head.weight", {c.vocab_size, h}, &w.lm_head));
  } else if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    return absl::InvalidArgumentError("weights: missing tensor 'lm_head.weight' (tie_word_embeddings is false)");
  }
  w.layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights& L = w.layers[l];
    Matrix q, k, v, gate, up;
    INFERD_RETURN_IF_ERROR(src.Read(p + "input_layernorm.weight", {h}, &L.input_norm));
    INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.q_proj.weight", {q_dim, h}, &q));
    INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.k_proj.weight", {kv_dim, h}, &k));
    INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.v_proj.weight", {kv_dim, h}, &v));
    L.qkv = StackRows({&q, &k, &v});
    if (c.qkv_bias) {
      Matrix qb, kb, vb;
      INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.q_proj.bias", {q_dim}, &qb));
      INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.k_proj.bias", {kv_dim}, &kb));
      INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.v_proj.bias", {kv_dim}, &vb));
      L.qkv_bias = ConcatVectors({&qb, &kb, &vb});
    }
    INFERD_RETURN_IF_ERROR(src.Read(p + "self_attn.o_proj.weight", {h, q_dim}, &L.o));
    INFERD_RETURN_IF_ERROR(src.Read(p + "post_attention_layernorm.weight", {h}, &L.post_norm));
    INFERD_RETURN_IF_ERROR(src.Read(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, &gate));
    INFERD_RETURN_IF_ERROR(src.Read(p + "mlp.up_proj.weight", {c.intermediate_size, h}, &up));
    L.gate_up = StackRows({&gate, &up});
    INFERD_RETURN_IF_ERROR(src.Read(p + "mlp.down_proj.weight", {h, c.intermediate_size}, &L.down));
  }
  w.stored_dtype = src.dtype();
  return w;
}

}  // namespace inferd

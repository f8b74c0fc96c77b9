#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/model/formats/safetensors.h"
#include "engine/model/model_tensors.h"
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

  // model.load_format dummy: no files; every tensor asked for is random, stored as `dtype` (an LM head only when
  // the config does not tie it to the embeddings).
  void MakeRandom(DType dtype, bool lm_head) {
    random_ = true;
    random_dtype_ = dtype;
    random_lm_head_ = lm_head;
    dtype_ = DTypeName(dtype);
  }

  bool Has(const std::string& name) const {
    if (random_) return name == "lm_head.weight" && random_lm_head_;
    return where_.count(name) > 0;
  }

  // Describes a tensor that must exist with the given shape ([n] for a vector, [rows, cols] otherwise).
  absl::Status Describe(const std::string& name, std::vector<int64_t> shape, TensorDesc* out) {
    if (random_) return DescribeRandom(name, shape, out);
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
    out->name = name;
    out->rows = shape.size() == 2 ? shape[0] : 1;
    out->cols = shape.back();
    out->dtype = info.dtype;
    out->bytes = it->second->Bytes(info);
    if (info.dtype == DType::kF8E4M3) INFERD_RETURN_IF_ERROR(ReadScales(name, out));
    return absl::OkStatus();
  }

  // An F8_E4M3 weight's `weight_scale` beside it: one fp32 (or 16-bit) value per row ([rows] or [rows, 1]) or one
  // for the tensor ([] or [1]), each finite and positive.
  absl::Status ReadScales(const std::string& name, TensorDesc* out) {
    if (!fp8_) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor '", name,
                                                     "' is F8_E4M3 but config.json has no quantization_config "
                                                     "describing an FP8 checkpoint"));
    }
    const std::string base = name.size() > 7 && name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    const std::string scale_name = base + ".weight_scale";
    auto it = where_.find(scale_name);
    if (it == where_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: tensor '", name, "' is F8_E4M3 but '", scale_name, "' is missing"));
    }
    const TensorInfo& info = it->second->tensors().at(scale_name);
    const int64_t n = info.numel();
    if (info.dtype == DType::kF8E4M3 || (n != 1 && n != out->rows) || info.shape.size() > 2 ||
        (info.shape.size() == 2 && info.shape[1] != 1)) {
      return absl::InvalidArgumentError(absl::StrCat("weights: '", scale_name, "' must hold one float per row (",
                                                     out->rows, ") or one for the tensor; it holds ", n, " ",
                                                     DTypeName(info.dtype), " values"));
    }
    out->scales.resize(n);
    ConvertToF32(info.dtype, it->second->Bytes(info), out->scales.data());
    for (float s : out->scales) {
      if (!(s > 0) || !std::isfinite(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat("weights: '", scale_name, "' holds ", s, "; allowed: finite values > 0"));
      }
    }
    any_fp8_ = true;
    return absl::OkStatus();
  }

  // A random tensor: seeded by its name; norms near 1, biases near 0, matrices of standard deviation 1/√cols (so
  // activations keep their scale through the layers, as in a trained model).
  absl::Status DescribeRandom(const std::string& name, const std::vector<int64_t>& shape, TensorDesc* out) {
    out->name = name;
    out->rows = shape.size() == 2 ? shape[0] : 1;
    out->cols = shape.back();
    out->dtype = random_dtype_;
    uint64_t seed = 0xcbf29ce484222325ull;  // FNV-1a of the name: a tensor's values do not depend on the others
    for (unsigned char ch : name) seed = (seed ^ ch) * 0x100000001b3ull;
    out->random_seed = seed | 1;
    if (name.ends_with("norm.weight")) {
      out->random_mean = 1.0f;
      out->random_std = 0.1f;
    } else if (shape.size() == 1) {
      out->random_std = 0.02f;
    } else {
      out->random_std = 1.0f / std::sqrt(static_cast<float>(out->cols));
    }
    return absl::OkStatus();
  }

  // A per-tensor scale beside the weights (an 8-bit float KV cache's k_scale or v_scale): one finite positive value.
  absl::Status ReadScalar(const std::string& name, float* out) {
    if (random_) {
      *out = 1.0f;
      return absl::OkStatus();
    }
    auto it = where_.find(name);
    if (it == where_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights: missing tensor '", name, "' (config.json's quantization_config.kv_cache_scheme needs one)"));
    }
    const TensorInfo& info = it->second->tensors().at(name);
    if (info.numel() != 1 || info.shape.size() > 1 || info.dtype == DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat("weights: '", name, "' must hold one float; it holds ",
                                                     info.numel(), " ", DTypeName(info.dtype), " values"));
    }
    ConvertToF32(info.dtype, it->second->Bytes(info), out);
    if (!(*out > 0) || !std::isfinite(*out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: '", name, "' holds ", *out, "; allowed: a finite value > 0"));
    }
    return absl::OkStatus();
  }

  void set_fp8(bool fp8) { fp8_ = fp8; }
  bool any_fp8() const { return any_fp8_; }

  std::vector<std::shared_ptr<const void>> TakeFiles() {
    std::vector<std::shared_ptr<const void>> out;
    for (auto& [name, f] : files_) out.push_back(std::shared_ptr<const SafetensorsFile>(std::move(f)));
    return out;
  }

  const std::string& dtype() const { return dtype_; }

 private:
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::string dtype_;
  bool fp8_ = false;      // config.json describes an FP8 checkpoint
  bool any_fp8_ = false;  // a tensor was F8_E4M3
  bool random_ = false;   // model.load_format dummy
  bool random_lm_head_ = false;
  DType random_dtype_ = DType::kBF16;
};

}  // namespace

absl::StatusOr<ModelTensors> DescribeHfTensors(const std::string& dir, const ModelConfig& c, bool random,
                                               DType random_dtype) {
  TensorSource src;
  if (random) {
    src.MakeRandom(random_dtype, !c.tie_word_embeddings);
  } else {
    INFERD_RETURN_IF_ERROR(src.Open(dir));
    src.set_fp8(c.quantization.fp8);
  }
  ModelTensors w;
  const int64_t h = c.hidden_size;
  INFERD_RETURN_IF_ERROR(src.Describe("model.embed_tokens.weight", {c.vocab_size, h}, &w.embed));
  INFERD_RETURN_IF_ERROR(src.Describe("model.norm.weight", {h}, &w.final_norm));
  if (src.Has("lm_head.weight")) {
    INFERD_RETURN_IF_ERROR(src.Describe("lm_head.weight", {c.vocab_size, h}, &w.lm_head));
  } else if (!c.tie_word_embeddings) {
    return absl::InvalidArgumentError("weights: missing tensor 'lm_head.weight' (tie_word_embeddings is false)");
  }
  w.layers.resize(c.num_layers);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerTensors& L = w.layers[l];
    INFERD_RETURN_IF_ERROR(DescribeLayer(
        c, /*gguf=*/false, l, p,
        [&](const std::string& name, const std::vector<int64_t>& shape, TensorDesc* out) {
          return src.Describe(name, shape, out);
        },
        &L));
    if (c.quantization.kv_cache_scales) {
      INFERD_RETURN_IF_ERROR(src.ReadScalar(p + "self_attn.k_scale", &L.k_cache_scale));
      INFERD_RETURN_IF_ERROR(src.ReadScalar(p + "self_attn.v_scale", &L.v_cache_scale));
    }
  }
  if (c.arch->norms_add_one) {  // the checkpoint stores w; the norms multiply by 1 + w
    w.final_norm.add = 1;
    for (LayerTensors& L : w.layers) {
      for (TensorDesc* n : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm, &L.attn_out_norm, &L.mlp_out_norm}) {
        n->add = 1;
      }
    }
  }
  w.kv_cache_scales = c.quantization.kv_cache_scales;
  w.stored_dtype = src.dtype();
  w.fp8_checkpoint = src.any_fp8();
  w.files = src.TakeFiles();
  return w;
}

}  // namespace inferd

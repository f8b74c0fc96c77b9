#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

using nlohmann::json;

absl::Status Field(const json& j, const char* key, int32_t* out, bool required, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("config.json: missing '", key, "'"));
    return absl::OkStatus();
  }
  if (!j[key].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: '", key, "' = ", j[key].dump(), " is not an integer"));
  }
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: '", key, "' = ", v, " is out of range; allowed: [", lo, ", ", hi, "]"));
  }
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

// Phi-3's LongRoPE: short and long factors (checked against the rotary width once it is known), the multiplier of
// cos and sin (attention_factor, else √(1 + ln(factor) / ln(original)) for factor = max / original positions).
absl::Status ParseLongRope(const json& j, const json& s, RopeConfig* rope) {
  rope->type = "longrope";
  for (auto [key, out] :
       {std::pair{"short_factor", &rope->short_factor}, std::pair{"long_factor", &rope->long_factor}}) {
    if (!s.contains(key) || !s[key].is_array() || s[key].empty() || s[key].size() > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: longrope scaling needs '", key, "' (a list)"));
    }
    for (const json& f : s[key]) {
      if (!f.is_number() || !(f.get<double>() > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.json: longrope ", key, " holds a value that is not > 0"));
      }
      out->push_back(f.get<float>());
    }
  }
  const json& orig = j.contains("original_max_position_embeddings")
                         ? j["original_max_position_embeddings"]
                         : s.value("original_max_position_embeddings", json());
  const json& max = j.contains("max_position_embeddings") ? j["max_position_embeddings"] : json();
  if (!orig.is_number_integer() || orig.get<int64_t>() < 2 || !max.is_number_integer()) {
    return absl::InvalidArgumentError(
        "config.json: longrope scaling needs original_max_position_embeddings (>= 2) and max_position_embeddings");
  }
  rope->original_max_position_embeddings = orig.get<int32_t>();
  rope->attention_factor = LongRopeAttentionFactor(max.get<double>(), orig.get<double>());
  if (s.contains("attention_factor") && s["attention_factor"].is_number()) {
    rope->attention_factor = s["attention_factor"].get<double>();
  }
  return absl::OkStatus();
}

absl::Status ParseRope(const json& j, RopeConfig* rope) {
  // transformers 5 keeps theta and scaling together in rope_parameters; 4 uses rope_theta + rope_scaling.
  const json* scaling = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    scaling = &j["rope_parameters"];
    if (scaling->contains("rope_theta")) rope->theta = (*scaling)["rope_theta"].get<double>();
  }
  if (j.contains("rope_theta") && j["rope_theta"].is_number()) rope->theta = j["rope_theta"].get<double>();
  if (!scaling && j.contains("rope_scaling") && j["rope_scaling"].is_object()) scaling = &j["rope_scaling"];
  if (!(rope->theta > 0)) return absl::InvalidArgumentError("config.json: rope_theta must be > 0");
  if (!scaling) return absl::OkStatus();
  const json& s = *scaling;
  std::string type = "default";
  if (s.contains("rope_type"))
    type = s["rope_type"].get<std::string>();
  else if (s.contains("type"))
    type = s["type"].get<std::string>();
  rope->type = type;
  if (type == "default") return absl::OkStatus();
  if (type == "longrope" || type == "su") return ParseLongRope(j, s, rope);
  if (type != "llama3" && type != "linear") {
    return absl::InvalidArgumentError(absl::StrCat("config.json: rope type '", type.substr(0, 40),
                                                   "' is not supported; supported: default, linear, llama3, longrope"));
  }
  if (!s.contains("factor") || !s["factor"].is_number() || !(s["factor"].get<double>() >= 1.0)) {
    return absl::InvalidArgumentError("config.json: rope scaling needs 'factor' >= 1");
  }
  rope->factor = s["factor"].get<double>();
  if (type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!s.contains(key) || !s[key].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: llama3 rope scaling needs '", key, "'"));
      }
    }
    rope->low_freq_factor = s["low_freq_factor"].get<double>();
    rope->high_freq_factor = s["high_freq_factor"].get<double>();
    rope->original_max_position_embeddings = s["original_max_position_embeddings"].get<int32_t>();
    if (!(rope->high_freq_factor > rope->low_freq_factor)) {
      return absl::InvalidArgumentError("config.json: llama3 rope scaling needs high_freq_factor > low_freq_factor");
    }
  }
  return absl::OkStatus();
}

void ReadIds(const json& j, const char* key, std::vector<int32_t>* out) {
  if (!j.contains(key)) return;
  const json& v = j[key];
  if (v.is_number_integer()) out->push_back(v.get<int32_t>());
  if (v.is_array()) {
    for (const json& x : v) {
      if (x.is_number_integer()) out->push_back(x.get<int32_t>());
    }
  }
}

// Which layers attend through a sliding window: layer_types ("sliding_attention" / "full_attention"), else every
// sliding_window_pattern-th layer global (the family's default pattern where the config has none).
absl::Status ParseWindows(const json& j, bool windowed, ModelConfig* c) {
  if (!windowed) return absl::OkStatus();
  const int64_t window = j["sliding_window"].get<int64_t>();
  if (window < 1) return absl::InvalidArgumentError("config.json: sliding_window must be >= 1");
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    c->layer_window.assign(c->num_layers, 0);
    const json& types = j["layer_types"];
    if (types.size() != static_cast<size_t>(c->num_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: layer_types has ", types.size(),
                                                     " entries; num_hidden_layers is ", c->num_layers));
    }
    for (int l = 0; l < c->num_layers; ++l) {
      const std::string t = types[l].is_string() ? types[l].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention") {
        return absl::InvalidArgumentError(absl::StrCat("config.json: layer_types[", l,
                                                       "] = ", types[l].dump().substr(0, 40),
                                                       "; allowed: sliding_attention, full_attention"));
      }
      if (t == "sliding_attention") c->layer_window[l] = static_cast<int32_t>(window);
    }
    return absl::OkStatus();
  }
  int32_t pattern = c->arch->sliding_window_pattern;
  absl::Status s = Field(j, "sliding_window_pattern", &pattern, false, 1, 1024);
  if (!s.ok()) return s;
  SetWindowPattern(c, static_cast<int32_t>(window), pattern);
  return absl::OkStatus();
}

// The sliding layers' rotary base: rope_local_base_freq (transformers 4), or rope_parameters.sliding_attention
// (transformers 5, whose rope_parameters.full_attention is then the global layers' rope).
absl::Status ParseLocalRope(const json& j, ModelConfig* c) {
  if (c->arch->sliding_rope_theta <= 0) return absl::OkStatus();  // one base for every layer (Gemma 2)
  c->rope_local_theta = c->arch->sliding_rope_theta;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("full_attention")) {
    const json& p = j["rope_parameters"];
    absl::Status s = ParseRope(json{{"rope_parameters", p["full_attention"]}}, &c->rope);
    if (!s.ok()) return s;
    if (p.contains("sliding_attention") && p["sliding_attention"].contains("rope_theta") &&
        p["sliding_attention"]["rope_theta"].is_number()) {
      c->rope_local_theta = p["sliding_attention"]["rope_theta"].get<double>();
    }
  }
  if (j.contains("rope_local_base_freq") && j["rope_local_base_freq"].is_number()) {
    c->rope_local_theta = j["rope_local_base_freq"].get<double>();
  }
  if (!(c->rope_local_theta > 0)) return absl::InvalidArgumentError("config.json: rope_local_base_freq must be > 0");
  return absl::OkStatus();
}

// query_pre_attn_scalar (the softmax scale is its inverse square root) and the soft caps (attention's only where
// the family applies it: Architecture::attn_softcap).
absl::Status ParseScales(const json& j, ModelConfig* c) {
  if (j.contains("query_pre_attn_scalar") && j["query_pre_attn_scalar"].is_number()) {
    const double q = j["query_pre_attn_scalar"].get<double>();
    if (!(q > 0)) return absl::InvalidArgumentError("config.json: query_pre_attn_scalar must be > 0");
    c->attention_scale = 1.0 / std::sqrt(q);
  }
  for (auto [key, out] : {std::pair{"attn_logit_softcapping", &c->attn_logit_softcap},
                          std::pair{"final_logit_softcapping", &c->final_logit_softcap}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (out == &c->attn_logit_softcap && !c->arch->attn_softcap) continue;  // the family does not apply it
    if (!j[key].is_number() || !(j[key].get<double>() > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, " must be null or > 0"));
    }
    *out = j[key].get<double>();
  }
  return absl::OkStatus();
}

// A mixture-of-experts family's experts: num_local_experts (Mixtral) or num_experts (Qwen3-MoE),
// num_experts_per_tok, moe_intermediate_size (else intermediate_size), norm_topk_prob, and which layers are sparse:
// every decoder_sparse_step-th (default 1) except those in mlp_only_layers.
absl::Status ParseExperts(const json& j, ModelConfig* c) {
  if (c->arch->expert_tensors.empty()) return absl::OkStatus();
  absl::Status s;
  const char* experts = j.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  if (!(s = Field(j, experts, &c->num_experts, true, 1, 4096)).ok()) return s;
  if (!(s = Field(j, "num_experts_per_tok", &c->experts_per_token, true, 1, c->num_experts)).ok()) return s;
  c->moe_intermediate_size = c->intermediate_size;
  if (!(s = Field(j, "moe_intermediate_size", &c->moe_intermediate_size, false, 1, 1 << 18)).ok()) return s;
  c->normalize_top_k = c->arch->normalize_top_k;
  if (j.contains("norm_topk_prob") && j["norm_topk_prob"].is_boolean()) {
    c->normalize_top_k = j["norm_topk_prob"].get<bool>();
  }
  int32_t step = 1;
  if (!(s = Field(j, "decoder_sparse_step", &step, false, 1, 1024)).ok()) return s;
  c->sparse_layers.assign(c->num_layers, false);
  for (int32_t l = 0; l < c->num_layers; ++l) c->sparse_layers[l] = (l + 1) % step == 0;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    if (!j["mlp_only_layers"].is_array()) {
      return absl::InvalidArgumentError("config.json: mlp_only_layers must be a list of layer indices");
    }
    for (const json& l : j["mlp_only_layers"]) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c->num_layers) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: mlp_only_layers holds ", l.dump().substr(0, 20),
                                                       "; allowed: layer indices 0..", c->num_layers - 1));
      }
      c->sparse_layers[l.get<int64_t>()] = false;
    }
  }
  if (c->arch->dense_layer.empty() &&
      std::find(c->sparse_layers.begin(), c->sparse_layers.end(), false) != c->sparse_layers.end()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", c->architecture,
                                                   " has no dense layers; decoder_sparse_step and mlp_only_layers "
                                                   "must leave every layer sparse"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string()) {
    return absl::InvalidArgumentError("config.json: missing 'architectures'");
  }
  c.architecture = j["architectures"][0].get<std::string>();
  c.arch = FindArchitecture(c.architecture);
  if (!c.arch) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: architecture '", c.architecture.substr(0, 80),
                                                   "' is not supported; supported: ", SupportedArchitectures()));
  }
  constexpr int64_t kBig = 1 << 24;
  absl::Status s;
  if (!(s = Field(j, "vocab_size", &c.vocab_size, true, 1, kBig)).ok()) return s;
  if (!(s = Field(j, "hidden_size", &c.hidden_size, true, 1, 1 << 16)).ok()) return s;
  if (!(s = Field(j, "intermediate_size", &c.intermediate_size, true, 1, 1 << 18)).ok()) return s;
  if (!(s = Field(j, "num_hidden_layers", &c.num_layers, true, 1, 1024)).ok()) return s;
  if (!(s = Field(j, "num_attention_heads", &c.num_heads, true, 1, 1024)).ok()) return s;
  c.num_kv_heads = c.num_heads;
  if (!(s = Field(j, "num_key_value_heads", &c.num_kv_heads, false, 1, 1024)).ok()) return s;
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_attention_heads = ", c.num_heads,
                                                   " is not a multiple of num_key_value_heads = ", c.num_kv_heads));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (!(s = Field(j, "head_dim", &c.head_dim, false, 2, 1024)).ok()) return s;
  if (c.head_dim % 2 != 0)
    return absl::InvalidArgumentError("config.json: head_dim must be even for rotary embeddings");
  if (!j.contains("head_dim") && c.hidden_size % c.num_heads != 0) {
    return absl::InvalidArgumentError("config.json: hidden_size is not a multiple of num_attention_heads");
  }
  c.rotary_dim = c.head_dim;
  if (j.contains("partial_rotary_factor") && j["partial_rotary_factor"].is_number()) {
    const double f = j["partial_rotary_factor"].get<double>();
    c.rotary_dim = static_cast<int32_t>(c.head_dim * f);
    if (!(f > 0 && f <= 1) || c.rotary_dim < 2 || c.rotary_dim % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: partial_rotary_factor = ", f, " gives ",
                                                     c.rotary_dim, " rotary dimensions of ", c.head_dim,
                                                     "; allowed: an even number >= 2"));
    }
  }
  c.max_position_embeddings = 2048;
  if (!(s = Field(j, "max_position_embeddings", &c.max_position_embeddings, false, 1, kBig)).ok()) return s;
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) c.rms_norm_eps = j["rms_norm_eps"].get<double>();
  if (!(c.rms_norm_eps > 0)) return absl::InvalidArgumentError("config.json: rms_norm_eps must be > 0");
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()) {
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("attention_bias") && j["attention_bias"].is_boolean() && j["attention_bias"].get<bool>()) {
    return absl::InvalidArgumentError("config.json: attention_bias = true is not supported");
  }
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.torch_dtype = j["torch_dtype"].get<std::string>();
  if (j.contains("dtype") && j["dtype"].is_string()) c.torch_dtype = j["dtype"].get<std::string>();
  // The activation the config names must be the one the family's MLP block computes.
  const std::vector<LayerOp>& layer = c.arch->layer;
  const bool gelu = std::find(layer.begin(), layer.end(), LayerOp::kGeluTanhMul) != layer.end();
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const std::string act = j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
    const bool ok = gelu ? (act == "gelu_pytorch_tanh" || act == "gelu_tanh") : act == "silu";
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, " = '", act.substr(0, 40), "' is not ",
                                                     c.architecture,
                                                     "'s; supported: ", gelu ? "gelu_pytorch_tanh" : "silu"));
    }
  }
  const bool windowed = j.contains("sliding_window") && j["sliding_window"].is_number_integer() &&
                        j["sliding_window"].get<int64_t>() < c.max_position_embeddings &&
                        !(j.contains("use_sliding_window") && j["use_sliding_window"].is_boolean() &&
                          !j["use_sliding_window"].get<bool>());
  if (windowed && !c.arch->sliding_window_pattern > 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: sliding_window = ", j["sliding_window"].dump(),
                                                   " is shorter than max_position_embeddings; sliding-window "
                                                   "attention is not supported for ",
                                                   c.architecture));
  }
  if (!(s = ParseWindows(j, windowed, &c)).ok()) return s;
  if (!(s = ParseScales(j, &c)).ok()) return s;
  if (!(s = ParseRope(j, &c.rope)).ok()) return s;
  for (const std::vector<float>* f : {&c.rope.short_factor, &c.rope.long_factor}) {
    if (c.rope.type == "longrope" && f->size() != static_cast<size_t>(c.rotary_dim / 2)) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: longrope factors hold ", f->size(),
                                                     " values; the rotary width needs ", c.rotary_dim / 2));
    }
  }
  if (c.arch->sliding_window_pattern > 0 && !(s = ParseLocalRope(j, &c)).ok()) return s;
  if (!(s = ParseExperts(j, &c)).ok()) return s;
  if (!(s = ParseQuantizationConfig(j, &c.quantization)).ok()) return s;
  ReadIds(j, "eos_token_id", &c.eos_token_ids);
  std::vector<int32_t> bos;
  ReadIds(j, "bos_token_id", &bos);
  if (!bos.empty()) c.bos_token_id = bos[0];
  return c;
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& c, bool local, bool long_positions) {
  const int32_t dim = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim;
  const int32_t half = dim / 2;
  std::vector<float> inv(half);
  if (local && c.rope_local_theta > 0) {  // the sliding layers': default rope, their own base
    for (int32_t i = 0; i < half; ++i) {
      inv[i] = static_cast<float>(1.0 / std::pow(c.rope_local_theta, (2.0 * i) / dim));
    }
    return inv;
  }
  for (int32_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope.theta, (2.0 * i) / dim);
    if (c.rope.type == "longrope") {  // as transformers: 1 / (factor · base^(2i/d)), in fp32
      const float base = static_cast<float>(std::pow(c.rope.theta, (2.0 * i) / dim));
      inv[i] = 1.0f / ((long_positions ? c.rope.long_factor : c.rope.short_factor).at(i) * base);
      continue;
    }
    if (c.rope.type == "linear") {
      f /= c.rope.factor;
    } else if (c.rope.type == "factors") {
      f /= c.rope.freq_factors.at(i);
    } else if (c.rope.type == "llama3") {
      const double old_len = c.rope.original_max_position_embeddings;
      const double low_wavelen = old_len / c.rope.low_freq_factor;
      const double high_wavelen = old_len / c.rope.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= c.rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_len / wavelen - c.rope.low_freq_factor) / (c.rope.high_freq_factor - c.rope.low_freq_factor);
        f = (1 - smooth) * f / c.rope.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

void SetWindowPattern(ModelConfig* c, int32_t window, int32_t pattern) {
  c->layer_window.assign(c->num_layers, 0);
  for (int32_t l = 0; l < c->num_layers; ++l) {
    if ((l + 1) % pattern != 0) c->layer_window[l] = window;
  }
}

double LongRopeAttentionFactor(double max_positions, double original_positions) {
  const double factor = max_positions / original_positions;
  return factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(original_positions));
}

}  // namespace inferd

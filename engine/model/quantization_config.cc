#include "engine/model/quantization_config.h"

#include "absl/strings/str_cat.h"

namespace inferd {
namespace {

using json = nlohmann::json;

absl::Status Refuse(const std::string& field, const json& value, const std::string& allowed) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: quantization_config.", field, " = ", value.dump(),
                                                 " is not supported; supported: ", allowed));
}

// A compressed-tensors quantization args object (weights or input_activations): 8-bit float, one of the
// strategies given.
absl::Status CheckArgs(const json& args, const std::string& field, const std::string& strategies_text,
                       std::initializer_list<const char*> strategies, std::string* strategy) {
  if (!args.is_object()) return Refuse(field, args, "an object");
  if (args.value("num_bits", json()) != 8) return Refuse(field + ".num_bits", args.value("num_bits", json()), "8");
  if (args.value("type", json()) != "float") return Refuse(field + ".type", args.value("type", json()), "\"float\"");
  const json s = args.value("strategy", json());
  for (const char* ok : strategies) {
    if (s == ok) {
      *strategy = ok;
      return absl::OkStatus();
    }
  }
  return Refuse(field + ".strategy", s, strategies_text);
}

absl::Status ParseCompressedTensors(const json& q, QuantizationConfig* out) {
  const json format = q.value("format", json());
  if (format != "float-quantized" && format != "naive-quantized") {
    return Refuse("format", format, "\"float-quantized\" (8-bit float weights)");
  }
  const json groups = q.value("config_groups", json());
  if (!groups.is_object() || groups.size() != 1) {
    return Refuse("config_groups", groups, "one group targeting the Linear layers");
  }
  const json& group = groups.begin().value();
  const std::string at = "config_groups." + groups.begin().key();
  std::string weights, inputs = "none";
  if (absl::Status s = CheckArgs(group.value("weights", json()), at + ".weights", "\"tensor\", \"channel\"",
                                 {"tensor", "channel"}, &weights);
      !s.ok()) {
    return s;
  }
  if (const json in = group.value("input_activations", json()); !in.is_null()) {
    if (absl::Status s =
            CheckArgs(in, at + ".input_activations", "\"token\", \"tensor\"", {"token", "tensor"}, &inputs);
        !s.ok()) {
      return s;
    }
  }
  if (group.value("output_activations", json()).is_object()) {
    return Refuse(at + ".output_activations", group["output_activations"], "null");
  }
  if (const json kv = q.value("kv_cache_scheme", json()); !kv.is_null()) {
    std::string kv_strategy;
    if (absl::Status s = CheckArgs(kv, "kv_cache_scheme", "\"tensor\"", {"tensor"}, &kv_strategy); !s.ok()) return s;
    if (kv.value("dynamic", json(false)) != false) {
      return Refuse("kv_cache_scheme.dynamic", kv["dynamic"], "false (scales stored in the checkpoint)");
    }
    out->kv_cache_scales = true;
  }
  out->fp8 = true;
  out->description =
      absl::StrCat("compressed-tensors float-quantized: weights per ", weights,
                   inputs == "none" ? ", inputs unquantized in the checkpoint" : ", inputs per " + inputs,
                   out->kv_cache_scales ? ", KV cache scales per tensor" : "");
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseQuantizationConfig(const json& config, QuantizationConfig* out) {
  *out = QuantizationConfig();
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return absl::OkStatus();
  const json& q = config["quantization_config"];
  if (!q.is_object()) return Refuse("", q, "an object");
  const json method = q.value("quant_method", json());
  if (method == "compressed-tensors") return ParseCompressedTensors(q, out);
  if (method == "fp8") {
    if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
      return Refuse("weight_block_size", q["weight_block_size"], "null (per-tensor weight scales)");
    }
    const json scheme = q.value("activation_scheme", json("dynamic"));
    if (scheme != "static" && scheme != "dynamic")
      return Refuse("activation_scheme", scheme, "\"static\", \"dynamic\"");
    out->fp8 = true;
    out->description = absl::StrCat("fp8: weights per tensor, inputs ", scheme.get<std::string>(), " per tensor");
    return absl::OkStatus();
  }
  return Refuse("quant_method", method, "\"compressed-tensors\" (float-quantized), \"fp8\"");
}

}  // namespace inferd

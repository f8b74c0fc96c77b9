#include "engine/model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> ReadFile(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> TokenName(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  if (j[key].is_string()) return j[key].get<std::string>();
  if (j[key].is_object() && j[key].contains("content") && j[key]["content"].is_string()) {
    return j[key]["content"].get<std::string>();
  }
  return std::nullopt;
}

void AddIds(const nlohmann::json& v, std::vector<int32_t>* out) {
  if (v.is_number_integer()) out->push_back(v.get<int32_t>());
  if (v.is_array()) {
    for (const auto& x : v) {
      if (x.is_number_integer()) out->push_back(x.get<int32_t>());
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path) {
  const fs::path dir(path);
  if (!fs::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("model.path = '", path, "' is not a directory"));
  }
  auto model = std::make_unique<Model>();
  model->name = dir.filename().string();
  const auto config_text = ReadFile(dir / "config.json");
  if (!config_text) return absl::NotFoundError(absl::StrCat("model '", path, "' has no config.json"));
  INFERD_ASSIGN_OR_RETURN(model->config, ParseModelConfig(*config_text));
  INFERD_ASSIGN_OR_RETURN(model->tokenizer, Tokenizer::FromFile((dir / "tokenizer.json").string()));
  if (model->tokenizer->vocab_size() > model->config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json has ", model->tokenizer->vocab_size(),
                                                   " tokens but config.json vocab_size is ", model->config.vocab_size));
  }
  INFERD_ASSIGN_OR_RETURN(model->weights, LoadHfWeights(path, model->config));

  std::vector<int32_t> eos = model->config.eos_token_ids;
  if (model->config.bos_token_id >= 0) model->bos_token_id = model->config.bos_token_id;
  if (const auto gen = ReadFile(dir / "generation_config.json")) {
    auto j = nlohmann::json::parse(*gen, nullptr, false);
    if (j.is_discarded()) return absl::InvalidArgumentError("generation_config.json is not valid JSON");
    if (j.contains("eos_token_id")) AddIds(j["eos_token_id"], &eos);
  }
  if (const auto tc = ReadFile(dir / "tokenizer_config.json")) {
    auto j = nlohmann::json::parse(*tc, nullptr, false);
    if (j.is_discarded()) return absl::InvalidArgumentError("tokenizer_config.json is not valid JSON");
    if (auto name = TokenName(j, "eos_token")) {
      if (auto id = model->tokenizer->TokenToId(*name)) eos.push_back(*id);
    }
    if (auto name = TokenName(j, "bos_token")) {
      if (auto id = model->tokenizer->TokenToId(*name); id && !model->bos_token_id) model->bos_token_id = *id;
    }
  }
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
  for (int32_t id : eos) {
    if (id < 0 || id >= model->config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos_token_id ", id, " is outside the vocabulary [0, ", model->config.vocab_size, ")"));
    }
  }
  model->eos_token_ids = std::move(eos);
  return model;
}

}  // namespace inferd

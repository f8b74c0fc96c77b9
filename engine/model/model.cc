#include "engine/model/model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/model/formats/gguf_model.h"
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

// Every eos id must name a token. The template's end-of-turn tokens end a generation like eos. The bos and
// eos texts are what chat templates print: for a GGUF file the tokens its ids name; for a Hugging Face
// directory only what tokenizer_config.json names (as transformers passes them), so they are set there.
absl::Status Finish(std::vector<int32_t> eos, const std::string& chat_template, bool texts_from_ids, Model* model) {
  for (const std::string& t : EndOfTurnTokens(chat_template)) {
    if (auto id = model->tokenizer->TokenToId(t)) eos.push_back(*id);
  }
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
  for (int32_t id : eos) {
    if (id < 0 || id >= model->config.vocab_size || id >= model->tokenizer->vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos_token_id ", id, " is outside the vocabulary [0, ", model->tokenizer->vocab_size(), ")"));
    }
  }
  if (model->bos_token_id && (*model->bos_token_id < 0 || *model->bos_token_id >= model->tokenizer->vocab_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bos_token_id ", *model->bos_token_id, " is outside the vocabulary [0, ", model->tokenizer->vocab_size(), ")"));
  }
  if (texts_from_ids && model->bos_token_id) model->bos_token = model->tokenizer->IdToToken(*model->bos_token_id);
  if (texts_from_ids && !eos.empty() && model->eos_token.empty()) {
    model->eos_token = model->tokenizer->IdToToken(eos.front());
  }
  model->eos_token_ids = std::move(eos);
  if (!chat_template.empty()) {
    auto t = ChatTemplate::Compile(chat_template, model->bos_token, model->eos_token);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("the model's chat template: ", t.status().message()));
    model->chat_template = std::move(*t);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> LoadGgufModel(const std::string& path) {
  INFERD_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> file, GgufFile::Open(path));
  auto model = std::make_unique<Model>();
  model->name = GgufString(file->contents(), "general.name");
  if (model->name.empty()) model->name = fs::path(path).stem().string();
  INFERD_ASSIGN_OR_RETURN(model->config, GgufModelConfig(*file));
  INFERD_ASSIGN_OR_RETURN(const nlohmann::json tokenizer_spec, GgufTokenizerJson(file->contents()));
  INFERD_ASSIGN_OR_RETURN(model->tokenizer, Tokenizer::FromSpec(tokenizer_spec));
  if (model->tokenizer->vocab_size() > model->config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", model->tokenizer->vocab_size(),
                                                   " tokens but a vocab_size of ", model->config.vocab_size));
  }
  INFERD_ASSIGN_OR_RETURN(model->tensors, DescribeGgufTensors(file, model->config));
  if (model->config.bos_token_id >= 0) model->bos_token_id = model->config.bos_token_id;
  const std::string chat_template = GgufString(file->contents(), "tokenizer.chat_template");
  if (const GgufValue* v = file->contents().Find("tokenizer.ggml.eos_token_id");
      v && v->is_integer() && v->i >= 0 && v->i < model->tokenizer->vocab_size()) {
    model->eos_token = model->tokenizer->IdToToken(static_cast<int32_t>(v->i));
  }
  INFERD_RETURN_IF_ERROR(Finish(model->config.eos_token_ids, chat_template, /*texts_from_ids=*/true, model.get()));
  return model;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, const LoadOptions& options) {
  const fs::path dir(path);
  if (!fs::exists(dir)) {
    return absl::NotFoundError(
        absl::StrCat("model.path '", path, "' does not exist (`bash scripts/setup.sh` fetches the default model)"));
  }
  if (!fs::is_directory(dir)) {
    if (options.random_weights) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.load_format = 'dummy' needs a Hugging Face directory "
                       "(config.json, tokenizer.json); model.path '",
                       path, "' is a file"));
    }
    auto model = LoadGgufModel(path);
    if (!model.ok() && model.status().message().find(path) == std::string::npos) {
      return absl::Status(model.status().code(), absl::StrCat(path, ": ", model.status().message()));
    }
    return model;
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
  const DType random_dtype = model->config.torch_dtype == "float16" ? DType::kF16 : DType::kBF16;
  INFERD_ASSIGN_OR_RETURN(model->tensors, DescribeHfTensors(path, model->config, options.random_weights, random_dtype));

  std::vector<int32_t> eos = model->config.eos_token_ids;
  if (model->config.bos_token_id >= 0) model->bos_token_id = model->config.bos_token_id;
  if (const auto gen = ReadFile(dir / "generation_config.json")) {
    auto j = nlohmann::json::parse(*gen, nullptr, false);
    if (j.is_discarded()) return absl::InvalidArgumentError("generation_config.json is not valid JSON");
    if (j.contains("eos_token_id")) AddIds(j["eos_token_id"], &eos);
  }
  std::string chat_template;
  if (const auto tc = ReadFile(dir / "tokenizer_config.json")) {
    auto j = nlohmann::json::parse(*tc, nullptr, false);
    if (j.is_discarded()) return absl::InvalidArgumentError("tokenizer_config.json is not valid JSON");
    if (auto name = TokenName(j, "eos_token")) {
      model->eos_token = *name;
      if (auto id = model->tokenizer->TokenToId(*name)) eos.push_back(*id);
    }
    if (auto name = TokenName(j, "bos_token")) {
      model->bos_token = *name;
      if (auto id = model->tokenizer->TokenToId(*name); id && !model->bos_token_id) model->bos_token_id = *id;
    }
    // A template string, or a list of named templates of which "default" is the one for chat.
    const nlohmann::json& t = j.value("chat_template", nlohmann::json());
    if (t.is_string()) {
      chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      for (const auto& named : t) {
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string()) {
          chat_template = named["template"].get<std::string>();
        }
      }
    }
  }
  if (const auto jinja = ReadFile(dir / "chat_template.jinja")) chat_template = *jinja;
  INFERD_RETURN_IF_ERROR(Finish(std::move(eos), chat_template, /*texts_from_ids=*/false, model.get()));
  return model;
}

}  // namespace inferd

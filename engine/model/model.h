// A loaded model: architecture, the description of its weights, tokenizer and the ids that end a generation.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/model/model_config.h"
#include "engine/model/model_tensors.h"
#include "engine/tokenizer/tokenizer.h"

namespace inferd {

struct Model {
  std::string name;
  ModelConfig config;
  ModelTensors tensors;  // where each weight lies in the mapped files; backends build from it
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> eos_token_ids;  // config.json ∪ generation_config.json ∪ tokenizer_config.json
  std::optional<int32_t> bos_token_id;
  std::string bos_token, eos_token;             // their text, as chat templates use them
  std::unique_ptr<ChatTemplate> chat_template;  // null when the model has none
};

struct LoadOptions {
  // model.load_format dummy: a Hugging Face directory's config.json and tokenizer.json alone; every weight random
  // (TensorDesc::random_seed), stored as config.json's torch_dtype (bfloat16 unless float16).
  bool random_weights = false;
};

// Loads a Hugging Face model directory or a GGUF file; every problem is an error that names the file and
// the field.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, const LoadOptions& options = {});

}  // namespace inferd

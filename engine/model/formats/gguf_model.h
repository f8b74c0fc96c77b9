// A Llama-family model stored in one GGUF file: the architecture from `<arch>.*` metadata, the weights
// (described, decoded by the backends) under llama.cpp's tensor names, and the tokenizer from `tokenizer.ggml.*`.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/formats/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/model_tensors.h"
#include "nlohmann/json.hpp"

namespace inferd {

// Architectures read: llama (and mistral, which llama.cpp also writes as llama) and qwen2.
absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file);

// Describes every tensor the config needs, checking type and shape; llama's q/k are marked as stored in
// llama.cpp's interleaved rotary order (DecodeRows returns the Hugging Face order). Keeps the file mapped.
absl::StatusOr<ModelTensors> DescribeGgufTensors(std::shared_ptr<const GgufFile> file, const ModelConfig& config);

// The tokenizer as the Hugging Face tokenizer.json document built from `tokenizer.ggml.*`: gpt2 (byte-level
// BPE, the pre-tokenizer named by tokenizer.ggml.pre) or llama (SentencePiece BPE, merges ranked by score).
absl::StatusOr<nlohmann::json> GgufTokenizerJson(const GgufContents& gguf);

// The string value of a metadata key, or "" when absent or not a string.
std::string GgufString(const GgufContents& gguf, std::string_view key);

}  // namespace inferd

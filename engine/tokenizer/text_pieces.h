// Normalizers and pre-tokenizers of Hugging Face tokenizer.json, as a pipeline of steps over text pieces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace inferd {

// One pre-tokenized piece and whether it begins at offset 0 of the original input (Metaspace "first").
struct Piece {
  std::string text;
  bool at_input_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Apply(std::string text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual std::vector<Piece> Apply(std::vector<Piece> pieces) const = 0;
};

// Builds from the "normalizer" / "pre_tokenizer" JSON (null gives nullptr); an unsupported type is an
// error naming it.
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& j);
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& j);

// GPT-2's reversible map of bytes to printable characters (byte-level BPE).
const std::string& ByteToUnicode(uint8_t byte);  // UTF-8 of the character for this byte
int UnicodeToByte(std::string_view utf8_char);   // -1 when the character is not in the map

}  // namespace inferd

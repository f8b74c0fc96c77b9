// BPE tokenizer read from a Hugging Face tokenizer.json: byte-level (GPT-2, Llama 3, Qwen2) and
// SentencePiece-style (Metaspace or Prepend+Replace, byte fallback), with added and special tokens.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/text_pieces.h"
#include "nlohmann/json_fwd.hpp"

namespace inferd {

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(const std::string& tokenizer_json);
  // The same from an already parsed tokenizer.json document.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSpec(const nlohmann::json& spec);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  ~Tokenizer();

  // Text must be valid UTF-8.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  // The whole text of ids, as the model's decoder renders it (invalid UTF-8 becomes U+FFFD).
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // The raw bytes one token adds to running text (no leading-space stripping). Empty for a skipped
  // special token.
  std::string TokenBytes(int32_t id, bool skip_special_tokens) const;
  // The byte of a byte-fallback token (<0xAB> of a SentencePiece-style model), or -1. Hugging Face's ByteFallback
  // decoder reads consecutive byte tokens as one run: ResolveByteRun gives its text.
  int FallbackByte(int32_t id, bool skip_special_tokens) const;
  // A run of byte tokens' bytes as ByteFallback renders it: the bytes when the run as a whole is valid UTF-8,
  // else one U+FFFD per byte (so <0x1C><0x83> is two replacement characters, not "\x1c" and one).
  static std::string ResolveByteRun(std::string_view run);

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  bool IsSpecial(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  const std::string& IdToToken(int32_t id) const { return id_to_token_.at(id); }

 private:
  Tokenizer();
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special, lstrip, rstrip;
  };
  void EncodeSegment(std::string segment, bool at_input_start, std::vector<int32_t>* out) const;
  void EncodeWord(const std::string& word, std::vector<int32_t>* out) const;
  std::vector<std::string> MergeSymbols(const std::string& word) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int32_t> merge_ranks_;  // "left\0right" -> rank
  std::vector<std::string> id_to_token_;
  std::vector<char> is_special_;
  std::vector<AddedToken> added_;  // longest first
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool byte_level_decoder_ = false;
  bool strip_leading_space_ = false;  // SentencePiece decoders drop the space of the first token
  std::string metaspace_ = "\xe2\x96\x81";
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // template post-processor, single sequence
  std::array<int32_t, 256> byte_token_ids_;       // <0xXX> ids for byte fallback, -1 if absent
};

}  // namespace inferd

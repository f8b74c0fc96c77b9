// The tokenizer of a GGUF file, written as the Hugging Face tokenizer.json that describes the same
// tokenizer, so that one implementation (engine/tokenizer.cc) serves both kinds of model.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "engine/model/formats/gguf_model.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

using nlohmann::json;

// llama.cpp token types.
constexpr int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4;

constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json Split(const char* regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// Llama 3's names: its tokenizer looks a whole word up in the vocabulary before merging (ignore_merges).
bool IsLlama3(const std::string& pre) {
  return pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe";
}

// tokenizer.ggml.pre names (as llama.cpp's converter writes them) and the pre-tokenizer each stands for.
absl::StatusOr<json> ByteLevelPreTokenizer(const std::string& pre) {
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2") return ByteLevel(true);
  if (IsLlama3(pre) || pre == "smaug-bpe" || pre == "dbrx") {
    return json{{"type", "Sequence"}, {"pretokenizers", {Split(kLlama3Split), ByteLevel(false)}}};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    return json{{"type", "Sequence"}, {"pretokenizers", {Split(kQwen2Split), ByteLevel(false)}}};
  }
  if (pre == "smollm") {  // every number character alone, then GPT-2's split
    return json{{"type", "Sequence"}, {"pretokenizers", {Split(R"(\p{N})"), ByteLevel(true)}}};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gguf: tokenizer.ggml.pre '", pre,
                   "' is not supported; supported: default, gpt2, llama3, llama-bpe, smaug-bpe, "
                   "dbrx, qwen2, deepseek-r1-qwen, smollm"));
}

// SentencePiece BPE merges from scores: every split of a token into two tokens of the vocabulary is a
// merge, and a merge that makes a higher-scored token applies first.
json MergesFromScores(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                      const std::vector<int64_t>& types) {
  std::map<std::string, int32_t> vocab;
  for (size_t i = 0; i < tokens.size(); ++i) vocab.emplace(tokens[i], static_cast<int32_t>(i));
  struct Merge {
    double score;
    int32_t id;
    std::string left, right;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != kNormal && types[i] != kUserDefined) continue;
    const std::string& t = tokens[i];
    for (size_t cut = 1; cut < t.size(); ++cut) {
      if ((static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
      auto l = vocab.find(t.substr(0, cut)), r = vocab.find(t.substr(cut));
      if (l != vocab.end() && r != vocab.end())
        merges.push_back({scores[i], static_cast<int32_t>(i), l->first, r->first});
    }
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& a, const Merge& b) { return a.score != b.score ? a.score > b.score : a.id < b.id; });
  json out = json::array();
  for (const Merge& m : merges) out.push_back({m.left, m.right});
  return out;
}

}  // namespace

absl::StatusOr<json> GgufTokenizerJson(const GgufContents& g) {
  const std::string model = GgufString(g, "tokenizer.ggml.model");
  const GgufValue* tokens_v = g.Find("tokenizer.ggml.tokens");
  if (!tokens_v || tokens_v->type != GgufType::kArray || tokens_v->elem_type != GgufType::kString ||
      tokens_v->strings.empty()) {
    return absl::InvalidArgumentError("gguf: tokenizer.ggml.tokens must be a non-empty array of strings");
  }
  const std::vector<std::string>& tokens = tokens_v->strings;
  const size_t n = tokens.size();
  std::vector<int64_t> types(n, kNormal);
  if (const GgufValue* t = g.Find("tokenizer.ggml.token_type")) {
    if (t->type != GgufType::kArray || t->ints.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: tokenizer.ggml.token_type must be an integer array of ", n, " entries"));
    }
    types = t->ints;
  }
  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const GgufValue* v = g.Find(key);
    if (!v || !v->is_integer() || v->i < 0 || static_cast<size_t>(v->i) >= n) return std::nullopt;
    return v->i;
  };
  json j;
  j["version"] = "1.0";
  json vocab = json::object();
  for (size_t i = 0; i < n; ++i) vocab[tokens[i]] = i;
  if (vocab.size() != n) return absl::InvalidArgumentError("gguf: tokenizer.ggml.tokens holds a token twice");
  json added = json::array();
  for (size_t i = 0; i < n; ++i) {
    if (types[i] == kControl || types[i] == kUnknown || types[i] == kUserDefined) {
      added.push_back({{"id", i},
                       {"content", tokens[i]},
                       {"special", types[i] != kUserDefined},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", types[i] == kUserDefined},
                       {"single_word", false}});
    }
  }
  j["added_tokens"] = added;
  const GgufValue* add_bos_v = g.Find("tokenizer.ggml.add_bos_token");
  const auto bos = id_of("tokenizer.ggml.bos_token_id");
  if (model == "gpt2") {
    const GgufValue* merges_v = g.Find("tokenizer.ggml.merges");
    if (!merges_v || merges_v->type != GgufType::kArray || merges_v->elem_type != GgufType::kString) {
      return absl::InvalidArgumentError("gguf: a gpt2 tokenizer needs tokenizer.ggml.merges (an array of strings)");
    }
    j["model"] = {{"type", "BPE"},
                  {"vocab", vocab},
                  {"merges", merges_v->strings},
                  {"byte_fallback", false},
                  {"ignore_merges", IsLlama3(GgufString(g, "tokenizer.ggml.pre"))}};
    auto pre = ByteLevelPreTokenizer(GgufString(g, "tokenizer.ggml.pre"));
    if (!pre.ok()) return pre.status();
    j["pre_tokenizer"] = *pre;
    // Qwen2's Hugging Face tokenizer composes text to NFC before splitting it.
    const std::string pre_name = GgufString(g, "tokenizer.ggml.pre");
    j["normalizer"] = pre_name == "qwen2" || pre_name == "deepseek-r1-qwen" ? json{{"type", "NFC"}} : json(nullptr);
    j["decoder"] = {{"type", "ByteLevel"}};
  } else if (model == "llama") {
    const GgufValue* scores_v = g.Find("tokenizer.ggml.scores");
    if (!scores_v || scores_v->type != GgufType::kArray || scores_v->floats.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: a llama tokenizer needs tokenizer.ggml.scores, a float array of ", n, " entries"));
    }
    j["model"] = {{"type", "BPE"},
                  {"vocab", vocab},
                  {"merges", MergesFromScores(tokens, scores_v->floats, types)},
                  {"byte_fallback", true},
                  {"fuse_unk", true}};
    if (auto unk = id_of("tokenizer.ggml.unknown_token_id")) j["model"]["unk_token"] = tokens[*unk];
    const GgufValue* prefix = g.Find("tokenizer.ggml.add_space_prefix");
    const bool add_prefix = !prefix || prefix->i != 0;
    json steps = json::array();
    if (add_prefix) steps.push_back({{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}});
    steps.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", steps}};
    j["pre_tokenizer"] = nullptr;
    json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\xe2\x96\x81"}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (add_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: tokenizer.ggml.model '", model, "' is not supported; supported: gpt2, llama"));
  }
  // A sentencepiece vocabulary adds BOS unless the file says otherwise; a gpt2 one only when it says so.
  const bool add_bos = add_bos_v ? add_bos_v->i != 0 : model == "llama";
  if (add_bos && bos) {
    const std::string& b = tokens[*bos];
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{b, {{"id", b}, {"ids", {*bos}}, {"tokens", {b}}}}}}};
  } else {
    j["post_processor"] = nullptr;
  }
  return j;
}

}  // namespace inferd

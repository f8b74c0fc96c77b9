#include "engine/tokenizer/text_pieces.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

using nlohmann::json;

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kMetaspace = "\xe2\x96\x81";  // U+2581

struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, int> to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? b : 256 + extra++;
      AppendUtf8(cp, &to_char[b]);
      to_byte[to_char[b]] = b;
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap map;
  return map;
}

// A compiled PCRE2 pattern (UTF + Unicode properties), shared read-only between threads.
class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: pre-tokenizer regex does not compile at offset ",
                                                     offset, ": ", reinterpret_cast<char*>(msg)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; matching works without it
    auto r = std::unique_ptr<Regex>(new Regex());
    r->code_ = code;
    return r;
  }
  ~Regex() { pcre2_code_free(code_); }

  // Splits text into matches and the gaps between them (behavior "Isolated").
  std::vector<std::string> SplitIsolated(const std::string& text) const {
    std::vector<std::string> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, last = 0;
    uint32_t options = 0;  // the first match checks the whole text's UTF-8; later ones need not re-check it
    while (pos <= text.size()) {
      const int rc =
          pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, options, md, nullptr);
      if (rc < 0) break;
      options = PCRE2_NO_UTF_CHECK;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty match: step over one character
        pos = ov[0] + 1;
        while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xc0) == 0x80) ++pos;
        continue;
      }
      if (ov[0] > last) out.push_back(text.substr(last, ov[0] - last));
      out.push_back(text.substr(ov[0], ov[1] - ov[0]));
      last = pos = ov[1];
    }
    if (last < text.size()) out.push_back(text.substr(last));
    pcre2_match_data_free(md);
    return out;
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
};

// --- Normalizers ---------------------------------------------------------------------------------

class SequenceNormalizer : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> steps;
  std::string Apply(std::string text) const override {
    for (const auto& s : steps) text = s->Apply(std::move(text));
    return text;
  }
};

class PrependNormalizer : public Normalizer {
 public:
  std::string prefix;
  std::string Apply(std::string text) const override { return text.empty() ? text : prefix + text; }
};

class ReplaceNormalizer : public Normalizer {
 public:
  std::string from, to;
  std::string Apply(std::string text) const override { return absl::StrReplaceAll(text, {{from, to}}); }
};

class UnicodeNormalizer : public Normalizer {
 public:
  bool compat = false;  // NFKC instead of NFC
  std::string Apply(std::string text) const override {
    utf8proc_uint8_t* out = nullptr;
    const int options = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (compat ? UTF8PROC_COMPAT : 0);
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                     &out, static_cast<utf8proc_option_t>(options));
    if (n < 0) return text;  // invalid UTF-8 cannot reach here: requests are validated first
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    free(out);
    return r;
  }
};

// --- Pre-tokenizers ------------------------------------------------------------------------------

class SequencePreTokenizer : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  std::vector<Piece> Apply(std::vector<Piece> pieces) const override {
    for (const auto& s : steps) pieces = s->Apply(std::move(pieces));
    return pieces;
  }
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  std::unique_ptr<Regex> regex;
  std::vector<Piece> Apply(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      bool first = p.at_input_start;
      for (std::string& s : regex->SplitIsolated(p.text)) {
        out.push_back({std::move(s), first});
        first = false;
      }
    }
    return out;
  }
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // GPT-2 split when use_regex
  std::vector<Piece> Apply(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      if (add_prefix_space && !p.text.empty() && p.text[0] != ' ') p.text = " " + p.text;
      std::vector<std::string> parts = regex ? regex->SplitIsolated(p.text) : std::vector<std::string>{p.text};
      bool first = p.at_input_start;
      for (const std::string& s : parts) {
        std::string mapped;
        for (unsigned char c : s) mapped += Bytes().to_char[c];
        out.push_back({std::move(mapped), first});
        first = false;
      }
    }
    return out;
  }
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  std::string replacement = kMetaspace;
  std::string prepend_scheme = "always";  // always | first | never
  bool split = true;
  std::vector<Piece> Apply(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      std::string t = absl::StrReplaceAll(p.text, {{" ", replacement}});
      const bool prepend = prepend_scheme == "always" || (prepend_scheme == "first" && p.at_input_start);
      if (prepend && t.compare(0, replacement.size(), replacement) != 0) t = replacement + t;
      if (!split) {
        out.push_back({std::move(t), p.at_input_start});
        continue;
      }
      // Each replacement character begins a new piece (MergedWithNext).
      size_t start = 0;
      bool first = p.at_input_start;
      for (size_t pos = t.find(replacement, 1); pos != std::string::npos; pos = t.find(replacement, pos + 1)) {
        if (pos > start) {
          out.push_back({t.substr(start, pos - start), first});
          first = false;
          start = pos;
        }
      }
      if (start < t.size()) out.push_back({t.substr(start), first});
    }
    return out;
  }
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  bool individual = false;
  std::vector<Piece> Apply(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      bool first = p.at_input_start;
      std::string cur;
      int cur_kind = -1;  // 1 digit, 0 other
      auto flush = [&] {
        if (!cur.empty()) out.push_back({std::move(cur), first}), first = false;
        cur.clear();
      };
      for (char c : p.text) {
        const int kind = (c >= '0' && c <= '9') ? 1 : 0;
        if (kind != cur_kind || (kind == 1 && individual)) flush();
        cur += c;
        cur_kind = kind;
      }
      flush();
    }
    return out;
  }
};

std::string JsonType(const json& j) {
  return j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

absl::StatusOr<std::string> SplitPattern(const json& j) {
  if (!j.contains("pattern") || !j["pattern"].is_object())
    return absl::InvalidArgumentError("tokenizer: Split needs a pattern");
  const json& p = j["pattern"];
  if (p.contains("Regex")) return p["Regex"].get<std::string>();
  if (p.contains("String")) {
    // A literal: quote every character for PCRE2.
    return absl::StrCat("\\Q", p["String"].get<std::string>(), "\\E");
  }
  return absl::InvalidArgumentError("tokenizer: Split pattern is neither Regex nor String");
}

}  // namespace

const std::string& ByteToUnicode(uint8_t byte) {
  return Bytes().to_char[byte];
}

int UnicodeToByte(std::string_view c) {
  auto it = Bytes().to_byte.find(std::string(c));
  return it == Bytes().to_byte.end() ? -1 : it->second;
}

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = JsonType(j);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNormalizer>();
    for (const json& s : j["normalizers"]) {
      INFERD_ASSIGN_OR_RETURN(auto step, MakeNormalizer(s));
      if (step) seq->steps.push_back(std::move(step));
    }
    return seq;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prefix = j["prepend"].get<std::string>();
    return n;
  }
  if (type == "Replace") {
    if (!j["pattern"].contains("String"))
      return absl::InvalidArgumentError("tokenizer: Replace normalizer supports String patterns only");
    auto n = std::make_unique<ReplaceNormalizer>();
    n->from = j["pattern"]["String"].get<std::string>();
    n->to = j["content"].get<std::string>();
    return n;
  }
  if (type == "NFC" || type == "NFKC") {
    auto n = std::make_unique<UnicodeNormalizer>();
    n->compat = type == "NFKC";
    return n;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer: normalizer type '", type, "' is not supported; supported: Sequence, Prepend, Replace, NFC, NFKC"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = JsonType(j);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePreTokenizer>();
    for (const json& s : j["pretokenizers"]) {
      INFERD_ASSIGN_OR_RETURN(auto step, MakePreTokenizer(s));
      if (step) seq->steps.push_back(std::move(step));
    }
    return seq;
  }
  if (type == "Split") {
    const std::string behavior = j.value("behavior", "Isolated");
    if (behavior != "Isolated" || j.value("invert", false)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: Split behavior '", behavior, "' (invert ",
                                                     j.value("invert", false),
                                                     ") is not supported; supported: Isolated"));
    }
    auto p = std::make_unique<SplitPreTokenizer>();
    INFERD_ASSIGN_OR_RETURN(const std::string pattern, SplitPattern(j));
    INFERD_ASSIGN_OR_RETURN(p->regex, Regex::Compile(pattern));
    return p;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      INFERD_ASSIGN_OR_RETURN(p->regex, Regex::Compile(kGpt2Pattern));
    }
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = j.value("replacement", std::string(kMetaspace));
    if (j.contains("prepend_scheme")) {
      p->prepend_scheme = j["prepend_scheme"].get<std::string>();
    } else if (j.contains("add_prefix_space")) {
      p->prepend_scheme = j["add_prefix_space"].get<bool>() ? "always" : "never";
    }
    p->split = j.value("split", true);
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = j.value("individual_digits", false);
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("tokenizer: pre_tokenizer type '", type,
                                                 "' is not supported; supported: Sequence, Split, ByteLevel, "
                                                 "Metaspace, Digits"));
}

}  // namespace inferd

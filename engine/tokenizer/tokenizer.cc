#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

using nlohmann::json;

std::string MergeKey(std::string_view a, std::string_view b) {
  std::string key(a);
  key.push_back('\0');
  key.append(b);
  return key;
}

absl::Status ParseDecoder(const json& d, bool* byte_level, bool* strip_first_space) {
  if (d.is_null()) return absl::OkStatus();
  const std::string type = d.value("type", "");
  if (type == "ByteLevel") {
    *byte_level = true;
  } else if (type == "Metaspace") {
    const std::string scheme = d.contains("prepend_scheme") ? d["prepend_scheme"].get<std::string>()
                                                            : (d.value("add_prefix_space", true) ? "always" : "never");
    *strip_first_space = scheme != "never";
  } else if (type == "Sequence") {
    for (const json& s : d["decoders"]) INFERD_RETURN_IF_ERROR(ParseDecoder(s, byte_level, strip_first_space));
  } else if (type == "Strip") {
    if (d.value("content", " ") == " " && d.value("start", 0) == 1) *strip_first_space = true;
  } else if (type != "Replace" && type != "ByteFallback" && type != "Fuse") {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: decoder type '", type, "' is not supported"));
  }
  return absl::OkStatus();
}

// The byte of a byte-fallback token "<0xAB>", or -1.
int ByteTokenValue(const std::string& tok) {
  if (tok.size() != 6 || tok.compare(0, 3, "<0x") != 0 || tok[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = tok[i];
    const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

Tokenizer::Tokenizer() {
  byte_token_ids_.fill(-1);
}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto t = FromJson(ss.str());
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("tokenizer: not a JSON object");
  return FromSpec(j);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSpec(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("tokenizer: not a JSON object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  try {
    const json& m = j.at("model");
    if (m.value("type", "BPE") != "BPE") {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: model type '", m.value("type", ""), "' is not supported; supported: BPE"));
    }
    if (!m.value("continuing_subword_prefix", json()).is_null() || !m.value("end_of_word_suffix", json()).is_null()) {
      return absl::InvalidArgumentError(
          "tokenizer: BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    }
    for (auto it = m.at("vocab").begin(); it != m.at("vocab").end(); ++it)
      t->vocab_[it.key()] = it.value().get<int32_t>();
    int32_t rank = 0;
    for (const json& merge : m.at("merges")) {
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("tokenizer: bad merge '", s, "'"));
        t->merge_ranks_.emplace(MergeKey(s.substr(0, sp), s.substr(sp + 1)), rank++);
      } else {
        t->merge_ranks_.emplace(MergeKey(merge.at(0).get<std::string>(), merge.at(1).get<std::string>()), rank++);
      }
    }
    t->byte_fallback_ = m.value("byte_fallback", false);
    t->fuse_unk_ = m.value("fuse_unk", false);
    t->ignore_merges_ = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = t->vocab_.find(m["unk_token"].get<std::string>());
      if (it != t->vocab_.end()) t->unk_id_ = it->second;
    }
    if (j.contains("added_tokens")) {
      for (const json& a : j["added_tokens"]) {
        AddedToken tok{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("special", false),
                       a.value("lstrip", false), a.value("rstrip", false)};
        if (tok.content.empty()) continue;
        t->vocab_[tok.content] = tok.id;
        t->added_.push_back(tok);
      }
    }
    std::stable_sort(t->added_.begin(), t->added_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    int32_t max_id = -1;
    for (const auto& [tok, id] : t->vocab_) {
      if (id < 0) return absl::InvalidArgumentError(absl::StrCat("tokenizer: token '", tok, "' has negative id ", id));
      max_id = std::max(max_id, id);
    }
    if (max_id < 0 || max_id > (1 << 24)) return absl::InvalidArgumentError("tokenizer: empty or oversized vocab");
    t->id_to_token_.assign(max_id + 1, "");
    t->is_special_.assign(max_id + 1, 0);
    for (const auto& [tok, id] : t->vocab_) t->id_to_token_[id] = tok;
    for (const AddedToken& a : t->added_) t->is_special_[a.id] = a.special;
    for (int b = 0; b < 256; ++b) {
      auto it = t->vocab_.find(absl::StrFormat("<0x%02X>", b));
      if (it != t->vocab_.end()) t->byte_token_ids_[b] = it->second;
    }
    INFERD_ASSIGN_OR_RETURN(t->normalizer_, MakeNormalizer(j.value("normalizer", json())));
    INFERD_ASSIGN_OR_RETURN(t->pre_tokenizer_, MakePreTokenizer(j.value("pre_tokenizer", json())));
    INFERD_RETURN_IF_ERROR(ParseDecoder(j.value("decoder", json()), &t->byte_level_decoder_, &t->strip_leading_space_));

    // Post-processor: only TemplateProcessing adds ids; ByteLevel post-processing touches offsets only.
    std::function<absl::Status(const json&)> post = [&](const json& p) -> absl::Status {
      if (p.is_null()) return absl::OkStatus();
      const std::string type = p.value("type", "");
      if (type == "Sequence") {
        for (const json& s : p["processors"]) INFERD_RETURN_IF_ERROR(post(s));
        return absl::OkStatus();
      }
      if (type == "ByteLevel") return absl::OkStatus();
      if (type != "TemplateProcessing") {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer: post_processor type '", type, "' is not supported"));
      }
      bool seen_sequence = false;
      for (const json& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        const json& ids = p.at("special_tokens").at(name).at("ids");
        for (const json& id : ids) (seen_sequence ? t->suffix_ids_ : t->prefix_ids_).push_back(id.get<int32_t>());
      }
      return absl::OkStatus();
    };
    INFERD_RETURN_IF_ERROR(post(j.value("post_processor", json())));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: malformed tokenizer.json: ", e.what()));
  }
  return t;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_special_[id];
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  if (add_special_tokens) out = prefix_ids_;
  // Split on added tokens first: the earliest match wins, the longest at equal positions.
  size_t pos = 0, seg_start = 0;
  std::string pending;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : added_) {
      if (text.compare(pos, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t seg_end = pos;
    if (hit->lstrip)
      while (seg_end > seg_start && is_space(text[seg_end - 1])) --seg_end;
    EncodeSegment(std::string(text.substr(seg_start, seg_end - seg_start)), seg_start == 0, &out);
    out.push_back(hit->id);
    pos += hit->content.size();
    if (hit->rstrip)
      while (pos < text.size() && is_space(text[pos])) ++pos;
    seg_start = pos;
  }
  EncodeSegment(std::string(text.substr(seg_start)), seg_start == 0, &out);
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

void Tokenizer::EncodeSegment(std::string segment, bool at_input_start, std::vector<int32_t>* out) const {
  if (segment.empty()) return;
  if (normalizer_) segment = normalizer_->Apply(std::move(segment));
  std::vector<Piece> pieces{{std::move(segment), at_input_start}};
  if (pre_tokenizer_) pieces = pre_tokenizer_->Apply(std::move(pieces));
  for (const Piece& p : pieces) {
    if (!p.text.empty()) EncodeWord(p.text, out);
  }
}

// Repeatedly merges the adjacent pair of lowest rank, leftmost on ties, as Hugging Face's BPE does — in
// O(n log n): symbols form a linked list over the word's characters and candidate pairs wait in a min-heap
// ordered by (rank, position); a popped candidate is used only if both its symbols are still as they were.
std::vector<std::string> Tokenizer::MergeSymbols(const std::string& word) const {
  struct Symbol {
    std::string text;
    int32_t prev = -1, next = -1;  // neighbours in the list; -1 at the ends
    bool alive = true;
  };
  struct Candidate {
    int32_t rank, left;
    size_t left_len, right_len;  // the sizes the two symbols had when the candidate was made
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Symbol> syms;
  for (std::string_view c : Utf8Chars(word)) {
    const int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({std::string(c), i - 1, -1, true});
    if (i > 0) syms[i - 1].next = i;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || syms[left].next < 0) return;
    const Symbol &a = syms[left], &b = syms[a.next];
    auto it = merge_ranks_.find(MergeKey(a.text, b.text));
    if (it != merge_ranks_.end()) heap.push({it->second, left, a.text.size(), b.text.size()});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& a = syms[c.left];
    if (!a.alive || a.next < 0 || a.text.size() != c.left_len) continue;
    Symbol& b = syms[a.next];
    if (b.text.size() != c.right_len) continue;  // a symbol only grows, so equal sizes mean unchanged
    a.text += b.text;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) syms[b.next].prev = c.left;
    consider(a.prev);
    consider(c.left);
  }
  std::vector<std::string> out;
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) out.push_back(std::move(syms[i].text));
  return out;
}

void Tokenizer::EncodeWord(const std::string& word, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const std::vector<std::string> symbols = MergeSymbols(word);
  bool last_was_unk = false;
  for (const std::string& s : symbols) {
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_token_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : s) out->push_back(byte_token_ids_[b]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_ && !(fuse_unk_ && last_was_unk)) out->push_back(*unk_id_);
    last_was_unk = true;
  }
}

std::string Tokenizer::TokenBytes(int32_t id, bool skip_special_tokens) const {
  if (id < 0 || id >= vocab_size()) return "";
  if (skip_special_tokens && is_special_[id]) return "";
  const std::string& tok = id_to_token_[id];
  // As Hugging Face's decoders run over every token, a byte-fallback piece such as <0x17> is its byte even
  // when the file also registers it as an added (special) token.
  if (is_special_[id] && !(byte_fallback_ && ByteTokenValue(tok) >= 0)) return tok;
  if (byte_level_decoder_) {
    std::string out;
    for (std::string_view c : Utf8Chars(tok)) {
      const int b = UnicodeToByte(c);
      if (b >= 0)
        out.push_back(static_cast<char>(b));
      else
        out.append(c);
    }
    return out;
  }
  if (const int b = ByteTokenValue(tok); b >= 0 && byte_token_ids_[b] == id)
    return std::string(1, static_cast<char>(b));
  return absl::StrReplaceAll(tok, {{metaspace_, " "}});
}

int Tokenizer::FallbackByte(int32_t id, bool skip_special_tokens) const {
  if (!byte_fallback_ || byte_level_decoder_ || id < 0 || id >= vocab_size()) return -1;
  if (skip_special_tokens && is_special_[id]) return -1;
  const int b = ByteTokenValue(id_to_token_[id]);
  return b >= 0 && byte_token_ids_[b] == id ? b : -1;
}

std::string Tokenizer::ResolveByteRun(std::string_view run) {
  if (IsValidUtf8(run)) return std::string(run);
  std::string out;
  for (size_t i = 0; i < run.size(); ++i) AppendUtf8(0xFFFD, &out);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes, run;
  for (int32_t id : ids) {
    if (const int b = FallbackByte(id, skip_special_tokens); b >= 0) {
      run.push_back(static_cast<char>(b));
      continue;
    }
    bytes += ResolveByteRun(run);
    run.clear();
    bytes += TokenBytes(id, skip_special_tokens);
  }
  bytes += ResolveByteRun(run);
  std::string text = Utf8Lossy(bytes, /*final=*/true);
  if (strip_leading_space_ && !text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

}  // namespace inferd

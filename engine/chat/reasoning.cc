#include "engine/chat/reasoning.h"

#include <algorithm>

namespace inferd {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool Blank(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// The length of the longest end of `text` that begins `tag`.
size_t TagPrefixAtEnd(std::string_view text, std::string_view tag) {
  size_t keep = std::min(text.size(), tag.size() - 1);
  while (keep > 0 && !tag.starts_with(text.substr(text.size() - keep))) --keep;
  return keep;
}

}  // namespace

bool TemplateThinks(const std::string& source) {
  return source.find(kClose) != std::string::npos;
}

bool PromptOpensReasoning(std::string_view prompt) {
  while (!prompt.empty() && Blank(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kOpen);
}

bool PromptClosesReasoning(std::string_view prompt) {
  while (!prompt.empty() && Blank(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kClose);
}

ReasoningPiece ReasoningStream::Feed(std::string_view text) {
  ReasoningPiece out;
  held_.append(text);
  if (state_ == kStart) {
    const size_t first = std::find_if_not(held_.begin(), held_.end(), Blank) - held_.begin();
    const std::string_view rest = std::string_view(held_).substr(first);
    if (rest.size() < kOpen.size() && kOpen.starts_with(rest)) return out;  // may still become <think>
    if (rest.starts_with(kOpen)) {
      held_.erase(0, first + kOpen.size());
      state_ = kReasoning;
    } else {
      state_ = kContent;
    }
  }
  if (state_ == kReasoning) {
    if (!reasoning_started_) {  // "<think>\n": the reasoning starts after the newline
      const size_t lead =
          std::find_if_not(held_.begin(), held_.end(), [](char c) { return c == '\n'; }) - held_.begin();
      held_.erase(0, lead);
      if (held_.empty()) return out;
      reasoning_started_ = true;
    }
    const size_t close = held_.find(kClose);
    if (close == std::string::npos) {
      const size_t keep = TagPrefixAtEnd(held_, kClose);
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    out.reasoning = held_.substr(0, close);
    held_.erase(0, close + kClose.size());
    state_ = kContent;
    skip_blank_lines_ = true;
  }
  if (skip_blank_lines_) {
    const size_t lead = std::find_if_not(held_.begin(), held_.end(), Blank) - held_.begin();
    held_.erase(0, lead);
    if (held_.empty()) return out;
    skip_blank_lines_ = false;
  }
  out.content = std::move(held_);
  held_.clear();
  return out;
}

ReasoningPiece ReasoningStream::Finish() {
  ReasoningPiece out;
  if (state_ == kReasoning) {
    out.reasoning = std::move(held_);
  } else if (!skip_blank_lines_) {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace inferd

// Reasoning a model writes before its answer, between <think> and </think> (Qwen3, DeepSeek-R1's distills, and
// any template that names </think>), split from the answer as the text streams: a <think> at the start of the
// output (after blanks) opens it, or the prompt did (a template whose assistant turn begins with <think>); </think>
// closes it, and the blank lines after it are dropped. Output that never opens a <think> is all answer; reasoning
// that never closes (max_tokens reached) is all reasoning.
#pragma once

#include <string>
#include <string_view>

namespace inferd {

// Whether a template's models think in <think>…</think>.
bool TemplateThinks(const std::string& template_source);
// Whether a rendered prompt already opened the reasoning (its last non-blank text is <think>).
bool PromptOpensReasoning(std::string_view prompt);
// Whether it already closed it (its last non-blank text is </think>: a template told not to think, as Qwen3's
// with enable_thinking false, writes an empty <think></think> into the assistant's turn).
bool PromptClosesReasoning(std::string_view prompt);

struct ReasoningPiece {
  std::string reasoning;
  std::string content;
};

class ReasoningStream {
 public:
  explicit ReasoningStream(bool opened_in_prompt) : state_(opened_in_prompt ? kReasoning : kStart) {}
  // What may go out now; text that may yet turn out to be a tag is held back.
  ReasoningPiece Feed(std::string_view text);
  ReasoningPiece Finish();

 private:
  enum State { kStart, kReasoning, kContent };
  State state_;
  bool skip_blank_lines_ = false;   // right after </think>
  bool reasoning_started_ = false;  // the reasoning's first text went out (its leading newline is dropped)
  std::string held_;
};

}  // namespace inferd

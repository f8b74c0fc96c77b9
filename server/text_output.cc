#include "server/text_output.h"

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace inferd {

TextOutput::TextOutput(const Tokenizer* tokenizer, TextOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)) {}

std::string TextOutput::Take(RequestOutput* out) {
  if (stopped_at_) {  // generated before the engine took the stop: not the client's
    out->token_ids.clear();
    out->logprobs.clear();
    if (out->finish != FinishReason::kNone) {
      out->finish = FinishReason::kStopString;
      out->error = absl::OkStatus();
      out->usage.completion_tokens = *stopped_at_;
    }
    return {};
  }
  std::string text;
  if (!out->error.ok()) return text;  // the request failed: it ends with the error
  const int32_t n = static_cast<int32_t>(out->token_ids.size());
  const int32_t first = out->usage.completion_tokens - n + 1;  // the first token's place in the output
  // An eos or stop token the engine ended the request with adds no text.
  const bool ends_on_token = out->finish == FinishReason::kEos || out->finish == FinishReason::kStopToken;
  for (int32_t i = 0; i < n - (ends_on_token ? 1 : 0); ++i) {
    if (!AddToken(out->token_ids[i], first + i, &text)) continue;
    stopped_at_ = first + i;
    out->token_ids.resize(i + 1);
    if (out->logprobs.size() > static_cast<size_t>(i + 1)) out->logprobs.resize(i + 1);
    out->usage.completion_tokens = *stopped_at_;
    // Ended by the engine here too (max_tokens at the same token): the stop string is the reason, as the
    // text shows it.
    if (out->finish != FinishReason::kNone) out->finish = FinishReason::kStopString;
    return text;
  }
  if (out->finish != FinishReason::kNone) text += Flush();
  return text;
}

bool TextOutput::AddToken(int32_t token, int32_t num_output, std::string* text) {
  // A run of byte-fallback tokens has its text only once it ends (its validity is the whole run's).
  if (const int b = tokenizer_->FallbackByte(token, options_.skip_special_tokens); b >= 0) {
    byte_run_.push_back(static_cast<char>(b));
    return false;
  }
  pending_bytes_ += Tokenizer::ResolveByteRun(byte_run_);
  byte_run_.clear();
  pending_bytes_ += tokenizer_->TokenBytes(token, options_.skip_special_tokens);
  size_t consumed = 0;
  held_text_ += Utf8Lossy(pending_bytes_, /*final=*/false, &consumed);
  pending_bytes_.erase(0, consumed);

  if (num_output >= options_.min_tokens && !options_.stop.empty()) {
    // Any stop string lies wholly inside held_text_: text that could begin one is never released.
    size_t best = std::string::npos, best_len = 0;
    for (const std::string& s : options_.stop) {
      const size_t at = held_text_.find(s);
      if (at != std::string::npos && at < best) best = at, best_len = s.size();
    }
    if (best != std::string::npos) {
      *text += held_text_.substr(0, best + (options_.include_stop_str_in_output ? best_len : 0));
      held_text_.clear();
      pending_bytes_.clear();
      byte_run_.clear();
      return true;
    }
  }
  size_t hold = 0;
  for (const std::string& s : options_.stop) {
    for (size_t n = std::min(s.size() - 1, held_text_.size()); n > hold; --n) {
      if (held_text_.compare(held_text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  *text += held_text_.substr(0, held_text_.size() - hold);
  held_text_.erase(0, held_text_.size() - hold);
  return false;
}

std::string TextOutput::Flush() {
  pending_bytes_ += Tokenizer::ResolveByteRun(byte_run_);
  std::string out = std::move(held_text_) + Utf8Lossy(pending_bytes_, /*final=*/true);
  held_text_.clear();
  pending_bytes_.clear();
  byte_run_.clear();
  return out;
}

}  // namespace inferd

#include "engine/runtime/output_processor.h"

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace inferd {

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, const Request* request, std::span<const int32_t> eos_ids)
    : tokenizer_(tokenizer), request_(request), eos_ids_(eos_ids.begin(), eos_ids.end()) {}

std::string OutputProcessor::Add(int32_t token, int32_t num_output, FinishReason* finish) {
  const StoppingParams& stop = request_->stopping;
  *finish = FinishReason::kNone;
  const bool may_stop = num_output >= stop.min_tokens;
  if (may_stop && !stop.ignore_eos && std::count(eos_ids_.begin(), eos_ids_.end(), token)) {
    *finish = FinishReason::kEos;
    return Flush();
  }
  if (may_stop && std::count(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token)) {
    *finish = FinishReason::kStopToken;
    return Flush();
  }
  pending_bytes_ += tokenizer_->TokenBytes(token, request_->skip_special_tokens);
  size_t consumed = 0;
  held_text_ += Utf8Lossy(pending_bytes_, /*final=*/false, &consumed);
  pending_bytes_.erase(0, consumed);

  if (may_stop && !stop.stop.empty()) {
    // Any stop string lies wholly inside held_text_: text that could begin one is never released.
    size_t best = std::string::npos, best_len = 0;
    for (const std::string& s : stop.stop) {
      const size_t at = held_text_.find(s);
      if (at != std::string::npos && at < best) best = at, best_len = s.size();
    }
    if (best != std::string::npos) {
      *finish = FinishReason::kStopString;
      std::string out = held_text_.substr(0, best + (stop.include_stop_str_in_output ? best_len : 0));
      held_text_.clear();
      pending_bytes_.clear();
      return out;
    }
  }
  if (num_output >= stop.max_tokens) {
    *finish = FinishReason::kLength;
    return Flush();
  }
  size_t hold = 0;
  for (const std::string& s : stop.stop) {
    for (size_t n = std::min(s.size() - 1, held_text_.size()); n > hold; --n) {
      if (held_text_.compare(held_text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = held_text_.substr(0, held_text_.size() - hold);
  held_text_.erase(0, held_text_.size() - hold);
  return out;
}

std::string OutputProcessor::Flush() {
  std::string out = std::move(held_text_) + Utf8Lossy(pending_bytes_, /*final=*/true);
  held_text_.clear();
  pending_bytes_.clear();
  return out;
}

}  // namespace inferd

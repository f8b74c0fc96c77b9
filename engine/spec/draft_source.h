// Where speculative decoding's drafts come from. A draft source proposes up to k tokens to follow a sequence; the
// engine then checks them in one step (1 + k query rows of the sequence, each sampled as the token at its position
// would be without drafts) and keeps the drafts while they equal their rows' tokens, then the token after them
// (engine/spec/verify.h). Sources are per sequence and hold no device state, so a draft model (its own KV) can be
// one more implementation of the same interface. A source may keep an index of the tokens it was shown (suffix
// decoding's, engine/spec/suffix_drafts.h), so it is asked again with the same sequence grown.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace inferd {

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Up to max_tokens tokens proposed to follow `tokens` (the sequence's prompt, then its output so far); empty:
  // nothing worth proposing.
  virtual std::vector<int32_t> Propose(std::span<const int32_t> tokens, int32_t max_tokens) = 0;
};

// Prompt lookup (vLLM's "ngram" method): for the longest n in [min_n, max_n] such that the sequence's last n tokens
// occurred earlier in it, the tokens that followed their latest earlier occurrence (read on into the draft where they
// reach the sequence's end, so that a loop is drafted on). Agent loops, code edits and
// summaries repeat spans of their prompt and of earlier answers, which this finds without a draft model. Looks back
// at most `lookback` tokens (the search is linear in it for each n).
class NgramDrafts : public DraftSource {
 public:
  NgramDrafts(int32_t min_n, int32_t max_n, int32_t lookback = 1 << 16);
  std::vector<int32_t> Propose(std::span<const int32_t> tokens, int32_t max_tokens) override;

 private:
  int32_t min_n_, max_n_, lookback_;
};

}  // namespace inferd

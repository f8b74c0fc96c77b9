#include "engine/spec/draft_source.h"

#include <algorithm>

#include "engine/check.h"

namespace inferd {

NgramDrafts::NgramDrafts(int32_t min_n, int32_t max_n, int32_t lookback)
    : min_n_(min_n), max_n_(max_n), lookback_(lookback) {
  INFERD_CHECK(min_n >= 1 && max_n >= min_n && lookback >= 1, "n-gram drafts need 1 <= min_n <= max_n");
}

std::vector<int32_t> NgramDrafts::Propose(std::span<const int32_t> tokens, int32_t max_tokens) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return {};
  const int64_t first = std::max<int64_t>(0, size - lookback_);  // the earliest start looked at
  for (int64_t n = std::min<int64_t>(max_n_, size - 1); n >= min_n_; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(size - n);
    // The latest earlier occurrence: starts at j, ends before the suffix itself begins to overlap its own end.
    for (int64_t j = size - n - 1; j >= first; --j) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + j)) continue;
      // What followed it, read on into the draft itself where it reaches the end: a sequence caught in a loop
      // of period p (its last occurrence p tokens back) drafts the loop on, not just p tokens.
      std::vector<int32_t> draft;
      for (int64_t i = j + n; static_cast<int32_t>(draft.size()) < max_tokens; ++i) {
        draft.push_back(i < size ? tokens[i] : draft[i - size]);
      }
      return draft;
    }
  }
  return {};
}

}  // namespace inferd

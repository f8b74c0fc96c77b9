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
      const int64_t from = j + n, count = std::min<int64_t>(max_tokens, size - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace inferd

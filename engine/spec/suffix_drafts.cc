#include "engine/spec/suffix_drafts.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/check.h"

namespace inferd {

SuffixCache::SuffixCache(int32_t max_depth, int64_t max_tokens) : trie_(max_depth), max_tokens_(max_tokens) {
  INFERD_CHECK(max_tokens >= 0, "a suffix cache holds a non-negative number of tokens");
}

void SuffixCache::AddOutput(std::vector<int32_t> output) {
  if (output.empty() || static_cast<int64_t>(output.size()) > max_tokens_) return;
  trie_.Add(output);
  held_ += static_cast<int64_t>(output.size());
  outputs_.push_back(std::move(output));
  while (held_ > max_tokens_) {
    trie_.Remove(outputs_.front());
    held_ -= static_cast<int64_t>(outputs_.front().size());
    outputs_.pop_front();
  }
}

SuffixDrafts::SuffixDrafts(const SuffixOptions& options, const SuffixCache* cache)
    : options_(options), cache_(cache), trie_(options.max_depth) {
  INFERD_CHECK(options.max_spec_factor >= 0 && options.min_token_prob >= 0 && options.min_token_prob <= 1,
               "suffix drafts' factor is non-negative and their least probability within [0, 1]");
}

std::vector<int32_t> SuffixDrafts::Propose(std::span<const int32_t> tokens, int32_t max_tokens) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  INFERD_CHECK(size >= indexed_, "a sequence's tokens only grow between proposals");
  for (int64_t i = indexed_; i < size; ++i) trie_.Append(cursor_, tokens[i]);
  indexed_ = size;
  std::vector<int32_t> best;
  double best_score = 0;
  for (const SuffixTrie* trie : {static_cast<const SuffixTrie*>(&trie_), cache_ ? &cache_->trie() : nullptr}) {
    if (!trie) continue;
    const auto [node, length] = trie->Match(tokens, options_.max_depth / 2);  // half the depth left to continue
    const double allowed = std::floor(options_.max_spec_factor * length + options_.max_spec_offset);
    const int32_t limit = static_cast<int32_t>(std::min<double>(max_tokens, allowed));
    if (length == 0 || limit <= 0) continue;
    double score = 0;
    std::vector<int32_t> draft = trie->Continue(node, limit, options_.min_token_prob, &score);
    if (score > best_score) {
      best = std::move(draft);
      best_score = score;
    }
  }
  return best;
}

}  // namespace inferd

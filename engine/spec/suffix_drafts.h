// Suffix decoding (Snowflake's Arctic Inference) as a draft source: a sequence's drafts continue the longest suffix
// of its tokens (of at most max_depth / 2, leaving the other half of a run to continue in) that occurred before, in a
// trie of its own prompt and output (engine/spec/suffix_trie.h) or in a trie of recent finished outputs that every
// sequence shares (SuffixCache), each next token the most frequent continuation while the estimated probability of the
// whole draft stays at least min_token_prob; a draft is at most max_spec_factor × the matched suffix's length (+
// max_spec_offset) tokens, so a long match earns a long draft. The candidate from either trie with the larger score
// (the tokens it is expected to get accepted) is proposed.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "engine/spec/draft_source.h"
#include "engine/spec/suffix_trie.h"

namespace inferd {

struct SuffixOptions {
  int32_t max_depth = 24;  // the longest run indexed (Arctic Inference's max_tree_depth)
  double max_spec_factor = 1.0;
  double max_spec_offset = 0.0;
  double min_token_prob = 0.1;
};

// The finished outputs the sequences draft from besides their own tokens: at most max_tokens of them, the oldest
// evicted first. One engine thread adds to it and reads it.
class SuffixCache {
 public:
  SuffixCache(int32_t max_depth, int64_t max_tokens);
  void AddOutput(std::vector<int32_t> output);
  const SuffixTrie& trie() const { return trie_; }
  int64_t tokens() const { return held_; }

 private:
  SuffixTrie trie_;
  int64_t max_tokens_, held_ = 0;
  std::deque<std::vector<int32_t>> outputs_;
};

class SuffixDrafts : public DraftSource {
 public:
  // `cache` (may be null) outlives this source.
  SuffixDrafts(const SuffixOptions& options, const SuffixCache* cache);
  // `tokens` extends the tokens of the last call (the prompt, then the accepted output): the new ones are indexed.
  std::vector<int32_t> Propose(std::span<const int32_t> tokens, int32_t max_tokens) override;

 private:
  SuffixOptions options_;
  const SuffixCache* cache_;
  SuffixTrie trie_;
  SuffixTrie::Cursor cursor_;
  int64_t indexed_ = 0;
};

}  // namespace inferd

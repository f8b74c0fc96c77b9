// Suffix decoding's index (Snowflake's Arctic Inference): a trie of every run of up to max_depth tokens of the
// sequences added to it, each node counting how often its run occurred. A run continues most often with its most
// frequent child, and count(child) over its siblings' counts summed (the run's occurrences that went on: not the one a
// growing sequence ends with) estimates how likely that continuation is. Depth-bounded, so a
// sequence of n tokens adds at most n · max_depth nodes (~70 bytes each: its count and links, and its entry in the
// (node, token) → child map). Not thread-safe: one engine thread uses it.
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace inferd {

class SuffixTrie {
 public:
  explicit SuffixTrie(int32_t max_depth);

  // One sequence growing token by token: each token extends every run of up to max_depth tokens ending with it.
  // Tokens of another sequence need a Cursor of their own.
  struct Cursor {
    std::vector<int32_t> frontier;  // the nodes of the sequence's last 0, 1, ... max_depth - 1 tokens
  };
  void Append(Cursor& cursor, int32_t token);
  // A whole sequence added (count +1 along every run) or taken back out (−1, nodes left with nothing removed), as a
  // bounded cache of finished outputs adds and evicts them.
  void Add(std::span<const int32_t> tokens);
  void Remove(std::span<const int32_t> tokens);

  // The longest suffix of `tokens`, of at most max_length tokens (and shorter than max_depth), that occurred with
  // something after it: its node and length (0 and 0 where none did). A run holds at most max_depth tokens, so a
  // match of m leaves room for max_depth − m more.
  std::pair<int32_t, int32_t> Match(std::span<const int32_t> tokens, int32_t max_length = INT32_MAX) const;
  // From a matched node, the most frequent continuation token by token while the product of the continuations'
  // estimated probabilities stays at least min_prob, at most max_tokens of them (and within max_depth of the
  // match's start); `score` gets the sum of those products (the tokens the draft is expected to get accepted).
  std::vector<int32_t> Continue(int32_t node, int32_t max_tokens, double min_prob, double* score) const;

  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()); }
  int32_t max_depth() const { return max_depth_; }

 private:
  struct Node {
    int32_t count = 0;
    int32_t token = -1;
    int32_t parent = -1, first_child = -1, next_sibling = -1;
  };
  static uint64_t Key(int32_t node, int32_t token) { return (uint64_t(uint32_t(node)) << 32) | uint32_t(token); }
  int32_t Child(int32_t node, int32_t token) const;
  int32_t ChildOrNew(int32_t node, int32_t token);
  void Unlink(int32_t node);  // out of its parent's list of children

  int32_t max_depth_;
  std::vector<Node> nodes_;  // [0]: the root, the empty run
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, int32_t> children_;  // (node, token) → child
};

}  // namespace inferd

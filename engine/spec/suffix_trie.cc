#include "engine/spec/suffix_trie.h"

#include <algorithm>

#include "engine/check.h"

namespace inferd {

SuffixTrie::SuffixTrie(int32_t max_depth) : max_depth_(max_depth), nodes_(1) {
  INFERD_CHECK(max_depth >= 2, "a suffix trie holds runs of at least 2 tokens (a match and its continuation)");
}

int32_t SuffixTrie::Child(int32_t node, int32_t token) const {
  const auto it = children_.find(Key(node, token));
  return it == children_.end() ? -1 : it->second;
}

int32_t SuffixTrie::ChildOrNew(int32_t node, int32_t token) {
  const auto [it, inserted] = children_.try_emplace(Key(node, token), -1);
  if (!inserted) return it->second;
  int32_t child;
  if (!free_.empty()) {
    child = free_.back();
    free_.pop_back();
  } else {
    child = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& c = nodes_[child];
  c = Node{.count = 0, .token = token, .parent = node, .first_child = -1, .next_sibling = nodes_[node].first_child};
  nodes_[node].first_child = child;
  it->second = child;
  return child;
}

void SuffixTrie::Unlink(int32_t node) {
  const Node& n = nodes_[node];
  int32_t* link = &nodes_[n.parent].first_child;
  while (*link != node) link = &nodes_[*link].next_sibling;
  *link = n.next_sibling;
}

void SuffixTrie::Append(Cursor& cursor, int32_t token) {
  if (cursor.frontier.empty()) cursor.frontier.push_back(0);
  std::vector<int32_t> next{0};
  next.reserve(max_depth_);
  for (size_t length = 0; length < cursor.frontier.size(); ++length) {
    const int32_t child = ChildOrNew(cursor.frontier[length], token);
    ++nodes_[child].count;
    if (length + 1 < static_cast<size_t>(max_depth_)) next.push_back(child);
  }
  cursor.frontier = std::move(next);
}

void SuffixTrie::Add(std::span<const int32_t> tokens) {
  Cursor cursor;
  for (int32_t t : tokens) Append(cursor, t);
}

void SuffixTrie::Remove(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> emptied;
  for (int64_t start = 0; start < n; ++start) {
    int32_t node = 0;
    for (int64_t i = start; i < std::min<int64_t>(n, start + max_depth_); ++i) {
      node = Child(node, tokens[i]);
      INFERD_CHECK(node >= 0 && nodes_[node].count > 0, "a sequence taken out of a suffix trie was added to it");
      if (--nodes_[node].count == 0) emptied.push_back(node);
    }
  }
  // A run's count bounds its continuations', so an emptied node's descendants are emptied too: only the emptied
  // nodes under a surviving parent (or the root) leave its list; then every emptied node is freed.
  for (int32_t node : emptied) {
    const int32_t parent = nodes_[node].parent;
    if (parent == 0 || nodes_[parent].count > 0) Unlink(node);
  }
  for (int32_t node : emptied) {
    children_.erase(Key(nodes_[node].parent, nodes_[node].token));
    nodes_[node] = Node{};
    free_.push_back(node);
  }
}

std::pair<int32_t, int32_t> SuffixTrie::Match(std::span<const int32_t> tokens, int32_t max_length) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t m = std::min<int64_t>({max_depth_ - 1, max_length, n}); m >= 1; --m) {
    int32_t node = 0;
    for (int64_t i = n - m; i < n && node >= 0; ++i) node = Child(node, tokens[i]);
    if (node >= 0 && nodes_[node].first_child >= 0) return {node, static_cast<int32_t>(m)};
  }
  return {0, 0};
}

std::vector<int32_t> SuffixTrie::Continue(int32_t node, int32_t max_tokens, double min_prob, double* score) const {
  std::vector<int32_t> out;
  double p = 1;
  *score = 0;
  while (static_cast<int32_t>(out.size()) < max_tokens) {
    int32_t best = -1;
    int64_t continued = 0;  // the run's occurrences with a token after them (not the sequence's own end)
    for (int32_t c = nodes_[node].first_child; c >= 0; c = nodes_[c].next_sibling) {
      const Node& a = nodes_[c];
      continued += a.count;
      if (best < 0 || a.count > nodes_[best].count || (a.count == nodes_[best].count && a.token < nodes_[best].token)) {
        best = c;
      }
    }
    if (best < 0) break;
    p *= double(nodes_[best].count) / double(continued);
    if (p < min_prob) break;
    out.push_back(nodes_[best].token);
    *score += p;
    node = best;
  }
  return out;
}

}  // namespace inferd

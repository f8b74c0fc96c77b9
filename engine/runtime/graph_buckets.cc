#include "engine/runtime/graph_buckets.h"

#include <algorithm>

#include "engine/check.h"
#include "engine/kv_cache/block_pool.h"
#include "engine/runtime/step_input.h"

namespace inferd {

std::vector<GraphBucket> GraphBucketsFor(const StepLimits& limits) {
  std::vector<int32_t> seqs;
  for (int32_t b = 1; b < limits.max_num_seqs; b *= 2) seqs.push_back(b);
  seqs.push_back(limits.max_num_seqs);
  std::vector<GraphBucket> buckets;
  for (int32_t s : seqs) buckets.push_back({.tokens = s, .seqs = s});
  if (limits.max_drafts > 0) {
    const int32_t most = std::min(limits.max_logits_rows(), limits.max_num_batched_tokens);
    for (int32_t s : seqs) {
      const int64_t tokens = int64_t{s} * (1 + limits.max_drafts);
      if (tokens > most) break;
      buckets.push_back({.tokens = static_cast<int32_t>(tokens), .seqs = s});
      if (limits.max_draft_batch > 0 && s >= limits.max_draft_batch) break;
    }
  }
  std::sort(buckets.begin(), buckets.end());
  return buckets;
}

std::vector<int32_t> PaddingSequences(GraphBucket bucket, int32_t seqs, int32_t tokens) {
  const int32_t n = bucket.seqs - seqs, t = bucket.tokens - tokens;
  if (n < 0 || t < n || (n == 0 && t > 0)) return {};
  std::vector<int32_t> padding(n, t / std::max(n, 1));
  for (int32_t i = 0; i < t % std::max(n, 1); ++i) ++padding[i];
  return padding;
}

int64_t PaddingPages(const std::vector<int32_t>& padding, int32_t block_size) {
  int64_t pages = 0;
  for (int32_t n : padding) pages += BlocksFor(n, block_size);
  return pages;
}

GraphBucket ChooseGraphBucket(const StepInput& in, const std::vector<GraphBucket>& buckets, int64_t max_pages) {
  const int32_t seqs = in.num_seqs(), tokens = in.num_tokens();
  if (seqs == 0 || in.num_logits() != tokens) return {};
  for (GraphBucket b : buckets) {
    if (b.seqs < seqs || b.tokens < tokens) continue;
    if (b.seqs == seqs && b.tokens == tokens) return b;
    const std::vector<int32_t> padding = PaddingSequences(b, seqs, tokens);
    if (!padding.empty() && in.kv_indptr.back() + PaddingPages(padding, in.block_size) <= max_pages) return b;
  }
  return {};
}

StepInput PadToBucket(const StepInput& in, GraphBucket bucket, int32_t reserved_block) {
  StepInput p = in;
  const std::vector<int32_t> padding = PaddingSequences(bucket, in.num_seqs(), in.num_tokens());
  for (int32_t n : padding) {
    const std::vector<int32_t> tokens(n, 0);
    const std::vector<std::vector<int32_t>> tables(in.num_kv_groups(),
                                                   std::vector<int32_t>(BlocksFor(n, in.block_size), reserved_block));
    AddSequence(&p, tokens, 0, n, tables, /*sampled_rows=*/n);
    for (int32_t i = 0; i < n; ++i) {
      SamplingRow& greedy = p.sampling.emplace_back();
      greedy.params.temperature = 0;
      greedy.position = i + 1;
    }
  }
  INFERD_CHECK(p.num_seqs() == bucket.seqs && p.num_tokens() == bucket.tokens,
               "a step is padded only to a bucket ChooseGraphBucket chose for it");
  return p;
}

}  // namespace inferd

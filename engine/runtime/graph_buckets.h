// The step shapes a backend replays from captured graphs (the cuda backend's CUDA graphs, decode_graphs.h): a
// bucket is a number of sequences and of tokens, every token's row sampling. Decode buckets have one token a
// sequence; verify buckets (speculative decoding) 1 + k, a sequence checking k drafted tokens. A smaller step
// replays a bucket padded with sequences of their own on the pool's reserved block. Pure C++: the choice and the
// padding are tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runtime/backend.h"

namespace inferd {

// Ordered by tokens, then sequences: the order in which ChooseGraphBucket tries them.
struct GraphBucket {
  int32_t tokens = 0;
  int32_t seqs = 0;

  bool empty() const { return seqs == 0; }
  bool decode() const { return seqs > 0 && tokens == seqs; }
  auto operator<=>(const GraphBucket&) const = default;
};

// The buckets for these limits: decode ones of 1, 2, 4, ... max_num_seqs sequences, then, when sequences draft
// (max_drafts > 0), verify ones of as many sequences up to the first that holds max_draft_batch (0: any), each
// sequence with 1 + max_drafts tokens, where that many tokens fit a step's tokens and logits rows.
std::vector<GraphBucket> GraphBucketsFor(const StepLimits& limits);  // sorted

// The padding that takes a step of `seqs` sequences and `tokens` tokens to `bucket`: its sequences' token counts
// (each at least one, spread evenly), empty when it cannot (fewer sequences or tokens in the bucket, or tokens
// left over with no sequence to hold them).
std::vector<int32_t> PaddingSequences(GraphBucket bucket, int32_t seqs, int32_t tokens);

// The pages the padding takes: a sequence of n tokens ceil(n / block_size) copies of the reserved block.
int64_t PaddingPages(const std::vector<int32_t>& padding, int32_t block_size);

// The first bucket of `buckets` (sorted) that replays `in`: every row of the step
// samples (num_logits == num_tokens), and its padding fits the page table's max_pages. Empty when none.
GraphBucket ChooseGraphBucket(const StepInput& in, const std::vector<GraphBucket>& buckets, int64_t max_pages);

// The step padded to `bucket`: the padding sequences compute tokens 0 at positions 0 .. n − 1 on copies of
// `reserved_block` (their K and V land there and are never read by a real sequence) and sample greedily.
StepInput PadToBucket(const StepInput& in, GraphBucket bucket, int32_t reserved_block);

}  // namespace inferd

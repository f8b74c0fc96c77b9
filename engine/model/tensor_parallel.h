// How one model splits across the devices of one host (tensor parallelism, Megatron-style). Rank r of N holds a
// contiguous run of the attention heads and of the MLP's intermediate columns (of every expert's, in a mixture of
// experts, whose router is whole on every rank): the fused q/k/v and gate/up
// products are split by output rows (column-parallel), the attention output and down products by input columns
// (row-parallel), so each layer needs one sum over the ranks after each of those two. A KV head is never split:
// with fewer KV heads than ranks, each is held by N / num_kv_heads ranks (the ones whose query heads read it).
// Embeddings and norms are whole on every rank; the LM head's rows (the vocabulary) split into runs, one per rank,
// each rank writing its run of every logits row (the cuda backend, where the GPUs reach each other's memory; rank
// 0 holds the whole LM head for when they do not). Pure arithmetic on the model's shape: the cpu backend's shards
// and the planner's per-device sizes both come from here.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_config.h"

namespace inferd {

// [begin, end) of some index (heads, columns, rows).
struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

struct TensorParallelShard {
  int32_t rank = 0, size = 1;
  IndexRange q_heads, kv_heads, intermediate;
  IndexRange expert_intermediate;  // of every expert (a mixture-of-experts model): its gate/up rows, down columns
  IndexRange vocab;                // the LM head's rows (token ids) whose logits this rank computes

  // Output rows of the fused q/k/v weight ([q; k; v], q_width + 2 kv_width rows) this rank holds, in order: its
  // query heads' rows, then its KV heads' K rows, then their V rows.
  std::vector<IndexRange> QkvRows(const ModelConfig& c) const;
  // Output rows of the fused gate/up weight ([gate; up], 2 intermediate rows): its gate rows, then its up rows.
  std::vector<IndexRange> GateUpRows(const ModelConfig& c) const;
  // The same for each expert's gate/up weight ([gate; up], 2 moe_intermediate rows).
  std::vector<IndexRange> ExpertGateUpRows(const ModelConfig& c) const;
  // The rank's own KV head (0-based within its shard) that its local query head h reads.
  int64_t LocalKvHead(const ModelConfig& c, int64_t h) const;
};

// Whether the model splits over `size` ranks; the error names engine.tensor_parallel_size, the value, the
// model's head and column counts and which sizes would do.
absl::Status CheckTensorParallel(const ModelConfig& c, int32_t size);
// Rank `rank` of `size` (CheckTensorParallel passed).
TensorParallelShard ShardOf(const ModelConfig& c, int32_t size, int32_t rank);

}  // namespace inferd

#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace inferd {

namespace {

bool Splits(const ModelConfig& c, int32_t n) {
  return n >= 1 && c.num_heads % n == 0 && c.intermediate_size % n == 0 && c.moe_intermediate_size % n == 0 &&
         (c.num_kv_heads % n == 0 || n % c.num_kv_heads == 0);
}

}  // namespace

std::vector<IndexRange> TensorParallelShard::QkvRows(const ModelConfig& c) const {
  const int64_t D = c.head_dim, q = c.q_width(), kv = c.kv_width();
  return {{q_heads.begin * D, q_heads.end * D},
          {q + kv_heads.begin * D, q + kv_heads.end * D},
          {q + kv + kv_heads.begin * D, q + kv + kv_heads.end * D}};
}

std::vector<IndexRange> TensorParallelShard::GateUpRows(const ModelConfig& c) const {
  const int64_t I = c.intermediate_size;
  return {intermediate, {I + intermediate.begin, I + intermediate.end}};
}

std::vector<IndexRange> TensorParallelShard::ExpertGateUpRows(const ModelConfig& c) const {
  const int64_t I = c.moe_intermediate_size;
  return {expert_intermediate, {I + expert_intermediate.begin, I + expert_intermediate.end}};
}

int64_t TensorParallelShard::LocalKvHead(const ModelConfig& c, int64_t h) const {
  const int64_t group = c.num_heads / c.num_kv_heads;
  return (q_heads.begin + h) / group - kv_heads.begin;
}

absl::Status CheckTensorParallel(const ModelConfig& c, int32_t size) {
  if (size == 1) return absl::OkStatus();
  if (Splits(c, size)) return absl::OkStatus();
  std::vector<int32_t> fits;
  for (int32_t n : {1, 2, 4, 8}) {
    if (Splits(c, n)) fits.push_back(n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("config: engine.tensor_parallel_size = ", size, " does not split this model: its ", c.num_heads,
                   " attention heads and ", c.intermediate_size, " MLP columns",
                   c.has_experts() ? absl::StrCat(" (", c.moe_intermediate_size, " of each expert)") : "",
                   " must divide by it, and its ", c.num_kv_heads,
                   " KV heads must divide by it or it by them; allowed for this model: ", absl::StrJoin(fits, ", ")));
}

TensorParallelShard ShardOf(const ModelConfig& c, int32_t size, int32_t rank) {
  TensorParallelShard s;
  s.rank = rank;
  s.size = size;
  const int64_t heads = c.num_heads / size, cols = c.intermediate_size / size;
  s.q_heads = {rank * heads, (rank + 1) * heads};
  s.intermediate = {rank * cols, (rank + 1) * cols};
  const int64_t expert_cols = c.moe_intermediate_size / size;
  s.expert_intermediate = {rank * expert_cols, (rank + 1) * expert_cols};
  if (c.num_kv_heads >= size) {
    const int64_t kv = c.num_kv_heads / size;
    s.kv_heads = {rank * kv, (rank + 1) * kv};
  } else {  // replicated: the one KV head its query heads share
    const int64_t group = c.num_heads / c.num_kv_heads;
    s.kv_heads = {s.q_heads.begin / group, s.q_heads.begin / group + 1};
  }
  // Equal runs of the vocabulary (the last one shorter), each starting on a multiple of 64 ids so that every
  // rank's logits start 256-byte aligned in a row of fp32 logits.
  const int64_t per = (c.vocab_size + int64_t{size} * 64 - 1) / (int64_t{size} * 64) * 64;
  s.vocab = {std::min<int64_t>(rank * per, c.vocab_size), std::min<int64_t>((rank + 1) * per, c.vocab_size)};
  return s;
}

}  // namespace inferd

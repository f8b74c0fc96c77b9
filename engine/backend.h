// The one seam between the engine and the device: a backend owns the KV pool's memory and runs a step.
// Both the cpu and the cuda backend read the same step input, so the scheduler cannot tell them apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace inferd {

// One step, packed on the host. Tokens of all sequences are concatenated in plan order.
struct StepInput {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens] position of each token in its sequence
  std::vector<int32_t> slot_mapping;  // [num_tokens] flat KV slot = block_id * block_size + offset
  std::vector<int32_t> query_start;   // [num_seqs + 1] first token of each sequence; back() = num_tokens
  std::vector<int32_t> context_lens;  // [num_seqs] tokens in the cache once this step's are written
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], -1 past the end
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logits_indices;  // [num_logits] token rows whose next-token logits are wanted

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
};

// How memory is shared out at start-up; printed in the log and must match what is allocated.
struct MemoryPlan {
  int64_t budget_bytes = 0;  // memory inferd may use for weights, activations and KV
  int64_t weight_bytes = 0;
  int64_t activation_bytes = 0;    // peak step workspace
  int64_t kv_bytes_per_block = 0;  // K and V of all layers for one block
  int32_t num_blocks = 0;
  std::string ToString() const;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const MemoryPlan& memory_plan() const = 0;
  // Runs the model over the step's tokens, writing their K/V into the pool, and fills
  // logits[num_logits, vocab_size] in fp32.
  virtual absl::Status Forward(const StepInput& input, std::vector<float>* logits) = 0;
};

}  // namespace inferd

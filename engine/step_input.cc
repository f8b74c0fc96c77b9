#include "engine/step_input.h"

#include <algorithm>

#include "engine/check.h"

namespace inferd {

StepInput BuildStepInput(const StepPlan& plan, int32_t block_size) {
  StepInput in;
  const int32_t num_seqs = static_cast<int32_t>(plan.seqs.size());
  in.token_ids.reserve(plan.num_tokens);
  in.positions.reserve(plan.num_tokens);
  in.slot_mapping.reserve(plan.num_tokens);
  in.query_start.push_back(0);
  for (const ScheduledSeq& s : plan.seqs) {
    in.max_blocks_per_seq = std::max(in.max_blocks_per_seq, static_cast<int32_t>(s.seq->block_table.size()));
  }
  in.block_tables.assign(int64_t{num_seqs} * in.max_blocks_per_seq, -1);
  for (int32_t i = 0; i < num_seqs; ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const Sequence& seq = *s.seq;
    INFERD_CHECK(BlocksFor(s.start + s.num_new, block_size) <= static_cast<int32_t>(seq.block_table.size()),
                 "a scheduled sequence has blocks for every token it computes");
    for (int32_t p = s.start; p < s.start + s.num_new; ++p) {
      in.token_ids.push_back(seq.tokens[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(seq.block_table[p / block_size] * block_size + p % block_size);
    }
    in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.context_lens.push_back(s.start + s.num_new);
    std::copy(seq.block_table.begin(), seq.block_table.end(),
              in.block_tables.begin() + int64_t{i} * in.max_blocks_per_seq);
    if (s.wants_token) in.logits_indices.push_back(in.query_start.back() - 1);
  }
  return in;
}

}  // namespace inferd

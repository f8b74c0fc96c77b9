#include "engine/runtime/step_input.h"

#include "engine/check.h"

namespace inferd {

StepInput BuildStepInput(const StepPlan& plan, int32_t block_size) {
  StepInput in;
  in.block_size = block_size;
  in.token_ids.reserve(plan.num_tokens);
  in.positions.reserve(plan.num_tokens);
  in.slot_mapping.reserve(plan.num_tokens);
  in.query_start.push_back(0);
  in.kv_indptr.push_back(0);
  for (const ScheduledSeq& s : plan.seqs) {
    const Sequence& seq = *s.seq;
    const int32_t context_len = s.start + s.num_new;
    const int32_t num_pages = BlocksFor(context_len, block_size);
    INFERD_CHECK(num_pages <= static_cast<int32_t>(seq.block_table.size()),
                 "a scheduled sequence has blocks for every token it computes");
    for (int32_t p = s.start; p < context_len; ++p) {
      in.token_ids.push_back(seq.tokens[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(seq.block_table[p / block_size] * block_size + p % block_size);
    }
    in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.context_lens.push_back(context_len);
    in.kv_indices.insert(in.kv_indices.end(), seq.block_table.begin(), seq.block_table.begin() + num_pages);
    in.kv_indptr.push_back(static_cast<int32_t>(in.kv_indices.size()));
    in.kv_last_page_len.push_back(context_len - (num_pages - 1) * block_size);
    if (s.wants_token) in.logits_indices.push_back(in.query_start.back() - 1);
  }
  return in;
}

}  // namespace inferd

#include "engine/runtime/step_input.h"

#include "engine/check.h"

namespace inferd {

StepInput EmptyStepInput(int32_t block_size, int32_t num_kv_groups) {
  StepInput in;
  in.block_size = block_size;
  in.slot_mapping.resize(num_kv_groups);
  in.kv_indices.resize(num_kv_groups);
  in.query_start.push_back(0);
  in.kv_indptr.push_back(0);
  return in;
}

namespace {

// AddSequence over `pages_of(g)`, group g's block ids: the step's one copy of the packing rule.
template <typename PagesOf>
void AddSequenceTo(StepInput* in, std::span<const int32_t> tokens, int32_t start, int32_t context_len, PagesOf pages_of,
                   int32_t sampled_rows) {
  const int32_t bs = in->block_size;
  const int32_t num_pages = BlocksFor(context_len, bs);
  INFERD_CHECK(context_len <= static_cast<int32_t>(tokens.size()) && 0 <= start && start < context_len,
               "a sequence of a step has an id for every token it computes, and computes one at least");
  INFERD_CHECK(0 <= sampled_rows && sampled_rows <= context_len - start, "a sequence samples from rows it computes");
  for (int32_t g = 0; g < in->num_kv_groups(); ++g) {
    const std::span<const int32_t> pages = pages_of(g);
    INFERD_CHECK(num_pages <= static_cast<int32_t>(pages.size()),
                 "a sequence of a step has blocks for every token it computes");
    for (int32_t p = start; p < context_len; ++p) {
      INFERD_CHECK(pages[p / bs] >= 0, "a token's K/V is written into a block its sequence holds");
      in->slot_mapping[g].push_back(pages[p / bs] * bs + p % bs);
    }
    in->kv_indices[g].insert(in->kv_indices[g].end(), pages.begin(), pages.begin() + num_pages);
  }
  for (int32_t p = start; p < context_len; ++p) {
    in->token_ids.push_back(tokens[p]);
    in->positions.push_back(p);
  }
  in->query_start.push_back(static_cast<int32_t>(in->token_ids.size()));
  in->context_lens.push_back(context_len);
  in->kv_indptr.push_back(static_cast<int32_t>(in->kv_indices[0].size()));
  in->kv_last_page_len.push_back(context_len - (num_pages - 1) * bs);
  for (int32_t r = sampled_rows; r > 0; --r) in->logits_indices.push_back(in->query_start.back() - r);
}

}  // namespace

void AddSequence(StepInput* in, std::span<const int32_t> tokens, int32_t start, int32_t context_len,
                 std::span<const std::vector<int32_t>> tables, int32_t sampled_rows) {
  INFERD_CHECK(static_cast<int32_t>(tables.size()) == in->num_kv_groups(), "a sequence has a block table per KV group");
  AddSequenceTo(
      in, tokens, start, context_len, [&](int32_t g) { return std::span<const int32_t>(tables[g]); }, sampled_rows);
}

void AddSequence(StepInput* in, std::span<const int32_t> tokens, int32_t start, int32_t context_len,
                 std::span<const int32_t> pages, bool sampled) {
  AddSequenceTo(
      in, tokens, start, context_len, [&](int32_t) { return pages; }, sampled ? 1 : 0);
}

StepInput BuildStepInput(const StepPlan& plan, int32_t block_size, int32_t num_kv_groups) {
  StepInput in = EmptyStepInput(block_size, num_kv_groups);
  in.token_ids.reserve(plan.num_tokens);
  in.positions.reserve(plan.num_tokens);
  for (std::vector<int32_t>& slots : in.slot_mapping) slots.reserve(plan.num_tokens);
  std::vector<int32_t> drafted;  // a sequence's tokens, then the drafts its step checks
  for (const ScheduledSeq& s : plan.seqs) {
    std::span<const int32_t> tokens = s.seq->tokens;
    if (s.num_drafts > 0) {
      drafted.assign(tokens.begin(), tokens.end());
      drafted.insert(drafted.end(), s.seq->drafts.begin(), s.seq->drafts.begin() + s.num_drafts);
      tokens = drafted;
    }
    AddSequence(&in, tokens, s.start, s.start + s.num_new, s.seq->block_tables, s.num_sampled_rows());
  }
  // Then the prompt rows, after every sampled row (a PendingToken names a sampled row by its index).
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    for (int32_t p = s.rows_begin; p < s.rows_end; ++p) in.logits_indices.push_back(in.query_start[i] + (p - s.start));
  }
  return in;
}

}  // namespace inferd

// Packs a StepPlan into the flat arrays every backend reads (sampling rows are added by the engine, which
// owns the requests' sampling state).
#pragma once

#include <span>

#include "engine/runtime/backend.h"
#include "engine/scheduler/scheduler.h"

namespace inferd {

// The logits rows: one per sequence that samples (1 + k checking k drafts: ScheduledSeq::num_drafts), in plan
// order, then each sequence's prompt rows
// (ScheduledSeq::rows_begin, rows_end), in plan and position order.
// num_kv_groups: the sequences' block tables (SchedulerLimits::kv_windows).
StepInput BuildStepInput(const StepPlan& plan, int32_t block_size, int32_t num_kv_groups = 1);

// Steps built by hand (the warm-up, start-up's largest step, padded decode rows) go through the same two calls
// as the scheduler's: an empty step, then one AddSequence per sequence.
StepInput EmptyStepInput(int32_t block_size, int32_t num_kv_groups = 1);
// Appends a sequence computing tokens[start .. context_len) this step (tokens holds at least context_len ids),
// its KV on `tables` (per KV group the block ids of its first ceil(context_len / block_size) blocks, kNoBlock where
// a window group let one go); its last `sampled_rows` tokens' rows sample (one, or 1 + k checking k drafted
// tokens; the caller appends their SamplingRows).
void AddSequence(StepInput* in, std::span<const int32_t> tokens, int32_t start, int32_t context_len,
                 std::span<const std::vector<int32_t>> tables, int32_t sampled_rows);
// The same with one page list for every KV group (the warm-up, padded rows).
void AddSequence(StepInput* in, std::span<const int32_t> tokens, int32_t start, int32_t context_len,
                 std::span<const int32_t> pages, bool sampled);

}  // namespace inferd

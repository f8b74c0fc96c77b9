// Continuous batching: decides, step by step, which sequences run and how many tokens each computes. The batch's
// composition (token budget, prefill chunks, max_num_seqs, priority order) is decided here; whether blocks fit,
// prefix reuse and who is preempted are Capacity's (capacity.h). Pure logic over a BlockPool; no tensors, no
// threads, no clock (the caller passes the time).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/time/time.h"
#include "engine/kv_cache/block_pool.h"
#include "engine/scheduler/capacity.h"
#include "engine/scheduler/sequence.h"

namespace inferd {

struct SchedulerLimits {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t block_size = 16;
  bool prefix_caching = false;  // a new sequence reuses cached full blocks of its longest known prefix
  // Prompt tokens one sequence may compute in a step while other requests wait (alone it takes the whole
  // budget); 0 = a quarter of max_num_batched_tokens.
  int32_t long_prefill_chunk = 0;
  // Every this many seconds of waiting raise a waiting request's priority by one (0 = never), so a stream of
  // high-priority requests cannot starve a low one forever.
  double priority_aging_s = 0;
  // With the prefix cache's host tier: cached device blocks written back ahead of their eviction, at most this
  // many a step (Capacity::WriteAhead).
  int32_t write_ahead_blocks = 16;
  // Per KV group (engine/model/kv_groups.h) its sliding window in tokens, 0 for global attention: a sequence holds
  // a block table per group, and a window group's blocks go back once no position to come attends to them.
  std::vector<int32_t> kv_windows = {0};
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t start = 0;         // first position computed this step (= num_computed before the step)
  int32_t num_new = 0;       // tokens computed this step: 1 for decode, a chunk for prefill
  bool wants_token = false;  // this step reaches the sequence's last token, so it samples the next one
  // prompt_logprobs: positions [rows_begin, rows_end) get a prompt row this step (Sequence::PromptRows).
  int32_t rows_begin = 0, rows_end = 0;
  // Speculative decoding: the decode also computes this many of seq->drafts (num_new = 1 + num_drafts), each row
  // sampled; the step's KV for them counts only once Resolve accepts them.
  int32_t num_drafts = 0;
  int32_t num_prompt_rows() const { return rows_end > rows_begin ? rows_end - rows_begin : 0; }
  int32_t num_sampled_rows() const { return wants_token ? 1 + num_drafts : 0; }
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;    // running sequences (by priority), then newly admitted ones
  std::vector<Sequence*> preempted;  // sent back to waiting this step; their blocks are free
  // KV copies to start before the step (on the copy stream): swap-outs and write-backs of evicted prefix blocks,
  // then swap-ins and host-tier restores. The step does not read what they bring in (those sequences load);
  // a block they read is not written by a step before they have read it.
  CopyBatch copies;
  int32_t num_tokens = 0;  // sum of num_new
  // prompt_logprobs rows (ScheduledSeq::rows_begin) and drafted tokens' rows together, at most max_num_seqs: while
  // planning, the rows granted so far (TakePromptRows, drafts); once planned, the step's.
  int32_t num_prompt_rows = 0;
  int32_t num_draft_rows = 0;
  // Planned ahead, this step left out what only a preemption or a swap-in could have made room for: the next
  // step is planned after the running one is collected.
  bool needs_sync = false;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // host_pool: host memory for preempted sequences' KV (swap) and the host tier of the prefix cache, shared as
  // `shares` says; null: preemption recomputes and the prefix cache has one tier.
  Scheduler(SchedulerLimits limits, BlockPool* pool, BlockPool* host_pool = nullptr, HostShares shares = {});

  // Queues a new sequence (its arrival and request.priority set).
  void Add(Sequence* seq);
  // Chooses this step's batch at time `now`:
  //  1. running sequences: decodes take one token each (and their Sequence::drafts while the budget, the step's
  //     extra rows and blocks allow: a draft never preempts anyone), prompts still prefilling share the rest of the
  //     budget (capped at long_prefill_chunk while others wait); blocks are granted highest priority first, and when
  //     they run out the lowest-priority, most recently admitted sequence is preempted (swapped out to host
  //     memory when swap space has room, else recomputed later) — never one
  //     that has not passed the point of its last preemption, unless nothing else can move;
  //  2. if nothing was preempted, waiting sequences by priority (aged) then arrival, while the budget,
  //     max_num_seqs and blocks allow — leaving one block free per running sequence, so admissions do not
  //     cause preemptions at the next block boundary; one that does not fit may preempt running ones of lower
  //     priority, and otherwise waits at the head of the queue (no smaller request overtakes it).
  //
  // ahead: the previous step is still running, so the last token of the sequences it samples for is a
  // PendingToken. A sequence then takes its next step before its pending token is known; nobody is preempted,
  // swapped or admitted over a running one (plan.needs_sync says when that was wanted), and a sequence whose
  // pending token is its last allowed one (stopping.max_tokens) waits.
  StepPlan Schedule(absl::Time now, bool ahead = false);
  // A step was launched: advances num_computed (over the tokens it computed, not its drafts) and appends
  // PendingToken(r) for each sequence that samples, r the index of its first sampled row.
  void Launched(const StepPlan& plan);
  // The token sampled at `position` of seq is known: replaces its PendingToken. With drafts checked, `tokens` are
  // the drafts accepted and then the token sampled after them: they all become its tokens, the accepted drafts'
  // K/V computed, and the blocks taken for rejected ones go back.
  void Resolve(Sequence* seq, int32_t position, std::span<const int32_t> tokens);
  void Resolve(Sequence* seq, int32_t position, int32_t token) { Resolve(seq, position, {&token, 1}); }
  // Launched, then Resolve with sampled[i] for the i-th sequence that sampled (a step collected at once).
  void Update(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // Removes a sequence wherever it is (finished or aborted) and frees its blocks at once.
  void Finish(Sequence* seq);
  // Copy batches up to `ticket` (StepPlan::copies) completed: sequences they load may run, and the host blocks
  // they held are released.
  void CopiesCompleted(uint64_t ticket);
  // The last copy batch asked for that has not completed, or 0.
  uint64_t copies_in_flight() const { return last_ticket_ > completed_ticket_ ? last_ticket_ : 0; }
  // A running sequence whose KV is still coming in.
  bool loading(const Sequence& seq) const { return seq.loading_ticket > completed_ticket_; }
  const Capacity& capacity() const { return capacity_; }

  const std::deque<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const SchedulerLimits& limits() const { return limits_; }
  const CapacityCounters& counters() const { return capacity_.counters(); }

 private:
  int64_t EffectivePriority(const Sequence& seq, absl::Time now) const;
  void OrderWaiting(absl::Time now);
  void GrantRunning(StepPlan* plan, bool ahead);
  void Admit(StepPlan* plan, bool ahead);
  // Caps the n tokens a sequence would compute so that its prompt rows fit the step's (max_num_seqs), and counts
  // them in the plan. 0: none is left, it waits.
  int32_t TakePromptRows(const Sequence& seq, int32_t n, StepPlan* plan) const;
  // Preempts a running sequence, dropping it from the plan if it was scheduled (returns the tokens it had
  // there); it waits again.
  int32_t PreemptRunning(Sequence* victim, StepPlan* plan);

  SchedulerLimits limits_;
  Capacity capacity_;
  std::deque<Sequence*> waiting_;
  std::deque<Sequence*> running_;
  uint64_t admissions_ = 0;
  uint64_t last_ticket_ = 0, completed_ticket_ = 0;  // copy batches asked for and completed
};

}  // namespace inferd

#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <optional>
#include <span>

#include "engine/check.h"

namespace inferd {

Scheduler::Scheduler(SchedulerLimits limits, BlockPool* pool) : limits_(limits), pool_(pool) {
  INFERD_CHECK(limits_.max_num_batched_tokens >= limits_.max_num_seqs, "the token budget covers one decode per seq");
}

void Scheduler::Add(Sequence* seq) {
  waiting_.push_back(seq);
}

bool Scheduler::AllocateFor(Sequence* seq, int32_t num_tokens) {
  const int32_t need = BlocksFor(num_tokens, limits_.block_size) - static_cast<int32_t>(seq->block_table.size());
  if (need <= 0) return true;
  if (!pool_->CanAllocate(need)) return false;
  const std::vector<int32_t> blocks = pool_->Allocate(need);
  seq->block_table.insert(seq->block_table.end(), blocks.begin(), blocks.end());
  return true;
}

void Scheduler::DropBlocks(Sequence* seq) {
  pool_->Free(seq->block_table);
  seq->block_table.clear();
  seq->block_keys.clear();
  seq->num_computed = 0;
}

void Scheduler::ReusePrefix(Sequence* seq) {
  if (!limits_.prefix_caching || !seq->block_table.empty()) return;
  const int32_t bs = limits_.block_size;
  const int32_t max_blocks = (seq->num_tokens() - 1) / bs;  // the last token is always computed: it samples
  uint64_t parent = 0;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * bs, bs);
    const uint64_t key = BlockPool::BlockKey(parent, tokens);
    const std::optional<int32_t> block = pool_->Reuse(key, tokens);
    if (!block) break;
    seq->block_table.push_back(*block);
    seq->block_keys.push_back(key);
    parent = key;
  }
  seq->num_computed = static_cast<int32_t>(seq->block_table.size()) * bs;
}

void Scheduler::RememberFullBlocks(Sequence* seq) {
  if (!limits_.prefix_caching) return;
  const int32_t bs = limits_.block_size;
  const int32_t full = seq->num_computed / bs;
  for (int32_t i = static_cast<int32_t>(seq->block_keys.size()); i < full; ++i) {
    const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * bs, bs);
    const uint64_t key = BlockPool::BlockKey(i == 0 ? 0 : seq->block_keys[i - 1], tokens);
    pool_->Remember(seq->block_table[i], key, tokens);
    seq->block_keys.push_back(key);
  }
}

void Scheduler::Preempt(Sequence* seq) {
  // Recompute: the blocks go back (full ones stay cached) and the sequence (prompt + output so far) is
  // prefilled again later, from its cached prefix when that is still there.
  DropBlocks(seq);
  seq->num_preemptions++;
  waiting_.push_front(seq);
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  int32_t budget = limits_.max_num_batched_tokens;

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int32_t num_new = std::min(seq->num_tokens() - seq->num_computed, budget);
    INFERD_CHECK(num_new > 0, "a running sequence always has a token to compute");
    bool self_preempted = false;
    while (!AllocateFor(seq, seq->num_computed + num_new)) {
      Sequence* victim = running_.back();
      running_.pop_back();
      Preempt(victim);
      plan.preempted.push_back(victim);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    plan.seqs.push_back({seq, seq->num_computed, num_new, seq->num_computed + num_new == seq->num_tokens()});
    budget -= num_new;
    ++i;
  }

  // New work is admitted only when nothing had to be preempted, so a preempted sequence goes first.
  while (plan.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < limits_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    ReusePrefix(seq);
    const int32_t num_new = std::min(seq->num_tokens() - seq->num_computed, budget);
    if (!AllocateFor(seq, seq->num_computed + num_new)) {
      DropBlocks(seq);  // the reused blocks go back until it fits
      break;
    }
    if (seq->num_preemptions == 0) seq->num_cached_tokens = seq->num_computed;
    waiting_.pop_front();
    running_.push_back(seq);
    plan.seqs.push_back({seq, seq->num_computed, num_new, seq->num_computed + num_new == seq->num_tokens()});
    budget -= num_new;
  }

  for (const ScheduledSeq& s : plan.seqs) plan.num_tokens += s.num_new;
  INFERD_CHECK(plan.num_tokens <= limits_.max_num_batched_tokens, "a step stays within max_num_batched_tokens");
  INFERD_CHECK(static_cast<int32_t>(plan.seqs.size()) <= limits_.max_num_seqs, "a step stays within max_num_seqs");
  return plan;
}

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  size_t next = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    s.seq->num_computed = s.start + s.num_new;
    RememberFullBlocks(s.seq);
    if (s.wants_token) {
      INFERD_CHECK(next < sampled.size(), "one sampled token per sequence that wanted one");
      s.seq->tokens.push_back(sampled[next++]);
    }
  }
  INFERD_CHECK(next == sampled.size(), "no sampled token is left over");
}

void Scheduler::Finish(Sequence* seq) {
  auto drop = [seq](std::deque<Sequence*>& q) {
    auto it = std::find(q.begin(), q.end(), seq);
    if (it != q.end()) q.erase(it);
  };
  drop(running_);
  drop(waiting_);
  DropBlocks(seq);
}

}  // namespace inferd

#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <tuple>

#include "engine/check.h"

namespace inferd {

Scheduler::Scheduler(SchedulerLimits limits, BlockPool* pool, BlockPool* host_pool, HostShares shares)
    : limits_(limits), capacity_(limits.block_size, limits.prefix_caching, pool, host_pool, shares, limits.kv_windows) {
  INFERD_CHECK(limits_.max_num_batched_tokens >= limits_.max_num_seqs, "the token budget covers one decode per seq");
  if (limits_.long_prefill_chunk <= 0) limits_.long_prefill_chunk = std::max(1, limits_.max_num_batched_tokens / 4);
}

void Scheduler::Add(Sequence* seq) {
  waiting_.push_back(seq);
}

int64_t Scheduler::EffectivePriority(const Sequence& seq, absl::Time now) const {
  int64_t p = seq.priority();
  if (limits_.priority_aging_s > 0 && now > seq.arrival) {
    p += static_cast<int64_t>(std::floor(absl::ToDoubleSeconds(now - seq.arrival) / limits_.priority_aging_s));
  }
  return p;
}

void Scheduler::OrderWaiting(absl::Time now) {
  // Higher (aged) priority first, then arrival (seq ids grow with arrival).
  auto before = [&](const Sequence* a, const Sequence* b) {
    const int64_t pa = EffectivePriority(*a, now), pb = EffectivePriority(*b, now);
    return pa != pb ? pa > pb : a->seq_id < b->seq_id;
  };
  if (!std::is_sorted(waiting_.begin(), waiting_.end(), before)) {
    std::stable_sort(waiting_.begin(), waiting_.end(), before);
  }
}

int32_t Scheduler::PreemptRunning(Sequence* victim, StepPlan* plan) {
  int32_t refunded = 0;
  auto scheduled =
      std::find_if(plan->seqs.begin(), plan->seqs.end(), [victim](const ScheduledSeq& s) { return s.seq == victim; });
  // Its drafts were counted once granted (or, not yet granted, once wanted).
  plan->num_draft_rows -= static_cast<int32_t>(victim->drafts.size());
  victim->drafts.clear();
  if (scheduled != plan->seqs.end()) {
    refunded = scheduled->num_new;
    plan->seqs.erase(scheduled);
  }
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  capacity_.Preempt(victim, &plan->copies);
  plan->preempted.push_back(victim);
  waiting_.push_front(victim);  // ordered with the rest at the next step
  return refunded;
}

int32_t Scheduler::TakePromptRows(const Sequence& seq, int32_t n, StepPlan* plan) const {
  if (!seq.scoring()) return n;
  const int32_t left = limits_.max_num_seqs - plan->num_prompt_rows - plan->num_draft_rows;
  const int32_t start = seq.num_computed;
  // Positions already scored (computed again after a preemption) take no row.
  n = std::max(0, std::min(n, std::max(start, seq.num_scored) - start + left));
  const auto [first, last] = seq.PromptRows(start, n);
  plan->num_prompt_rows += std::max(0, last - first);
  return n;
}

void Scheduler::GrantRunning(StepPlan* plan, bool ahead) {
  // Composition: every decode gets its token (the budget is at least max_num_seqs); prefilling prompts share
  // what is left, in admission order, each capped while others wait.
  int32_t decodes = 0;
  // A sequence whose pending token is its last (only when planning ahead) computes nothing more.
  const auto done = [](const Sequence* seq) {
    return seq->num_output_tokens() >= seq->request.stopping.max_tokens && IsPendingToken(seq->tokens.back());
  };
  for (const Sequence* seq : running_) {
    decodes += seq->num_tokens() - seq->num_computed == 1 && !done(seq) && !loading(*seq);
  }
  int32_t prefill_budget = limits_.max_num_batched_tokens - decodes;
  std::vector<std::pair<Sequence*, int32_t>> wants;
  for (Sequence* seq : running_) {
    if (done(seq) || loading(*seq)) {
      seq->drafts.clear();
      continue;
    }
    const int32_t remaining = seq->num_tokens() - seq->num_computed;
    INFERD_CHECK(remaining > 0, "a running sequence always has a token to compute");
    int32_t n = 1;
    if (remaining == 1 && !seq->drafts.empty()) {
      // Drafts take what the budget and the step's extra rows leave; planned ahead (the last token pending) none.
      const int32_t rows_left = limits_.max_num_seqs - plan->num_prompt_rows - plan->num_draft_rows;
      const int32_t k = ahead ? 0 : std::min({static_cast<int32_t>(seq->drafts.size()), prefill_budget, rows_left});
      seq->drafts.resize(std::max(k, 0));
      n += static_cast<int32_t>(seq->drafts.size());
      prefill_budget -= n - 1;
      plan->num_draft_rows += n - 1;
    } else {
      seq->drafts.clear();
    }
    if (remaining > 1) {
      n = std::min({remaining, prefill_budget, waiting_.empty() ? remaining : limits_.long_prefill_chunk});
      n = TakePromptRows(*seq, n, plan);
      prefill_budget -= n;
    }
    if (n > 0) wants.emplace_back(seq, n);
  }
  // Capacity: blocks go to the highest priority first (then the earliest admitted).
  std::stable_sort(wants.begin(), wants.end(), [](const auto& a, const auto& b) {
    return a.first->priority() != b.first->priority() ? a.first->priority() > b.first->priority()
                                                      : a.first->admitted_order < b.first->admitted_order;
  });
  std::vector<Sequence*> ungranted;
  for (const auto& [seq, n] : wants) ungranted.push_back(seq);
  for (const auto& [seq, wanted] : wants) {
    if (std::find(plan->preempted.begin(), plan->preempted.end(), seq) != plan->preempted.end()) continue;
    ungranted.erase(std::find(ungranted.begin(), ungranted.end(), seq));  // there: not preempted yet
    bool granted = true;
    int32_t n = wanted;
    if (!seq->drafts.empty() && !capacity_.Grow(seq, seq->num_computed + n, 0, &plan->copies)) {
      // Blocks for the drafts are not worth anyone's preemption: the decode goes on without them.
      plan->num_draft_rows -= n - 1;
      n = 1;
      seq->drafts.clear();
    }
    while (!capacity_.Grow(seq, seq->num_computed + n, 0, &plan->copies)) {
      if (ahead) {  // it waits; the next step, planned with the results in, may preempt
        plan->needs_sync = true;
        granted = false;
        break;
      }
      Sequence* victim = Capacity::ChooseVictim(ungranted, seq, INT32_MAX);
      if (!victim && !seq->awaiting_progress()) victim = seq;
      // Everyone left is awaiting progress: preempting one of them again beats standing still.
      if (!victim) victim = Capacity::ChooseVictim(ungranted, seq, INT32_MAX, /*spare_awaiting=*/false);
      if (!victim) {
        granted = false;  // nothing can make room: it waits for blocks this step
        break;
      }
      PreemptRunning(victim, plan);
      ungranted.erase(std::remove(ungranted.begin(), ungranted.end(), victim), ungranted.end());
      if (victim == seq) {
        granted = false;
        break;
      }
    }
    const int32_t k = static_cast<int32_t>(seq->drafts.size());
    if (granted) {
      plan->seqs.push_back({.seq = seq,
                            .start = seq->num_computed,
                            .num_new = n,
                            .wants_token = seq->num_computed + n - k == seq->num_tokens(),
                            .num_drafts = k});
    } else {
      plan->num_draft_rows -= k;
      seq->drafts.clear();
    }
  }
}

void Scheduler::Admit(StepPlan* plan, bool ahead) {
  int32_t budget = limits_.max_num_batched_tokens;
  for (const ScheduledSeq& s : plan->seqs) budget -= s.num_new;
  const uint64_t first_this_step = admissions_ + 1;
  // Running sequences a newcomer may displace: not admitted in this step, not loading (a copy writes its blocks).
  auto displaceable = [&] {
    std::vector<Sequence*> v;
    for (Sequence* s : running_) {
      if (s->admitted_order < first_this_step && !loading(*s)) v.push_back(s);
    }
    return v;
  };
  while (!waiting_.empty() && budget > 0) {
    Sequence* seq = waiting_.front();
    if (static_cast<int32_t>(running_.size()) >= limits_.max_num_seqs) {
      Sequence* victim = Capacity::ChooseVictim(displaceable(), seq, seq->priority());
      if (!victim) break;
      if (ahead) {
        plan->needs_sync = true;
        break;
      }
      budget += PreemptRunning(victim, plan);
      std::swap(waiting_[0], waiting_[1]);  // the newcomer stays at the head, the victim right behind it
    }
    const bool swapped = !seq->swapped_blocks.empty();
    if (swapped && ahead) {  // swaps wait for a step planned with nothing running
      plan->needs_sync = true;
      break;
    }
    // A request that scores its prompt computes all of it: cached blocks have no logits.
    if (!swapped && !seq->scoring()) capacity_.ReusePrefix(seq);
    // A newcomer leaves a block per KV group free per running sequence, for their next tokens: admitting into the
    // last free blocks would only preempt someone at the next block boundary (a preemption storm).
    const auto headroom = [&] { return static_cast<int32_t>(running_.size()) * capacity_.num_groups(); };
    if (swapped || !seq->restoring.empty()) {
      // Its KV comes in on the copy stream (swap-in, or host-tier blocks of its prefix): it is admitted with
      // blocks for its computed tokens and runs from the first step after the copies completed.
      const auto load = [&] {
        return swapped ? capacity_.SwapIn(seq, headroom(), &plan->copies)
                       : capacity_.Restore(seq, headroom(), &plan->copies);
      };
      bool fits = load();
      while (!fits) {
        Sequence* victim = Capacity::ChooseVictim(displaceable(), seq, seq->priority());
        if (!victim || ahead) {
          plan->needs_sync = plan->needs_sync || (victim && ahead);
          break;
        }
        budget += PreemptRunning(victim, plan);
        std::swap(waiting_[0], waiting_[1]);
        fits = load();
      }
      if (!fits) {
        if (!swapped) capacity_.Release(seq);
        break;
      }
      capacity_.Admitted(seq);
      seq->admitted_order = ++admissions_;
      waiting_.pop_front();
      running_.push_back(seq);
      continue;
    }
    const int32_t remaining = seq->num_tokens() - seq->num_computed;
    const int32_t n = TakePromptRows(
        *seq, std::min({remaining, budget, waiting_.size() > 1 ? limits_.long_prefill_chunk : remaining}), plan);
    if (n == 0) {  // no prompt row is left this step
      capacity_.Release(seq);
      break;
    }
    const auto fit = [&] { return capacity_.Grow(seq, seq->num_computed + n, headroom(), &plan->copies); };
    bool fits = fit();
    while (!fits) {
      Sequence* victim = Capacity::ChooseVictim(displaceable(), seq, seq->priority());
      if (!victim) break;
      if (ahead) {
        plan->needs_sync = true;
        break;
      }
      budget += PreemptRunning(victim, plan);
      std::swap(waiting_[0], waiting_[1]);
      fits = fit();
    }
    if (!fits) {
      capacity_.Release(seq);  // the reused blocks go back (still cached) until it fits
      break;
    }
    capacity_.Admitted(seq);
    seq->admitted_order = ++admissions_;
    waiting_.pop_front();
    running_.push_back(seq);
    plan->seqs.push_back({seq, seq->num_computed, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  }
}

StepPlan Scheduler::Schedule(absl::Time now, bool ahead) {
  StepPlan plan;
  plan.copies.ticket = last_ticket_ + 1;  // kept only if the step asks for copies
  OrderWaiting(now);
  GrantRunning(&plan, ahead);
  // New work is admitted only when blocks did not run short, so preempted sequences are not overtaken.
  if (plan.preempted.empty() && !plan.needs_sync) Admit(&plan, ahead);
  capacity_.WriteAhead(limits_.write_ahead_blocks, &plan.copies);
  int32_t prompt_rows = 0, draft_rows = 0;
  for (ScheduledSeq& s : plan.seqs) {
    plan.num_tokens += s.num_new;
    draft_rows += s.num_drafts;
    std::tie(s.rows_begin, s.rows_end) = s.seq->PromptRows(s.start, s.num_new);
    prompt_rows += s.num_prompt_rows();
  }
  plan.num_prompt_rows = prompt_rows;
  INFERD_CHECK(draft_rows == plan.num_draft_rows, "the drafted rows granted are those planned");
  if (plan.copies.empty()) {
    plan.copies.ticket = 0;
  } else {
    last_ticket_ = plan.copies.ticket;
  }
  INFERD_CHECK(plan.num_tokens <= limits_.max_num_batched_tokens, "a step stays within max_num_batched_tokens");
  INFERD_CHECK(prompt_rows + plan.num_draft_rows <= limits_.max_num_seqs,
               "a step's prompt rows and drafted rows stay within max_num_seqs");
  INFERD_CHECK(static_cast<int32_t>(plan.seqs.size()) <= limits_.max_num_seqs, "a step stays within max_num_seqs");
  return plan;
}

void Scheduler::Launched(const StepPlan& plan) {
  int32_t row = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    Sequence* seq = s.seq;
    seq->num_computed = s.start + s.num_new - s.num_drafts;
    if (s.num_prompt_rows() > 0) seq->num_scored = s.rows_end;
    // A block is remembered under its tokens' ids, so not while its last computed token is still pending.
    if (!IsPendingToken(seq->tokens[seq->num_computed - 1])) capacity_.RememberFullBlocks(seq);
    if (s.wants_token) seq->tokens.push_back(PendingToken(row));
    row += s.num_sampled_rows();
  }
}

void Scheduler::Resolve(Sequence* seq, int32_t position, std::span<const int32_t> tokens) {
  INFERD_CHECK(position < seq->num_tokens() && IsPendingToken(seq->tokens[position]), "a pending token is resolved");
  INFERD_CHECK(!tokens.empty() && std::ranges::none_of(tokens, IsPendingToken), "sampled tokens are real ids");
  const int32_t accepted = static_cast<int32_t>(tokens.size()) - 1;
  INFERD_CHECK(accepted == 0 || (position == seq->num_tokens() - 1 && seq->num_computed == position &&
                                 accepted <= static_cast<int32_t>(seq->drafts.size())),
               "accepted drafts follow the sequence's last token, which the step computed");
  seq->tokens[position] = tokens[0];
  seq->tokens.insert(seq->tokens.begin() + position + 1, tokens.begin() + 1, tokens.end());
  seq->num_computed += accepted;  // the step wrote the accepted drafts' K/V
  seq->drafts.clear();
  capacity_.RememberFullBlocks(seq);
  capacity_.Shrink(seq);
}

void Scheduler::Update(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  Launched(plan);
  size_t next = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.wants_token) continue;
    INFERD_CHECK(next < sampled.size(), "one sampled token per sequence that wanted one");
    Resolve(s.seq, s.start + s.num_new, sampled[next++]);
  }
  INFERD_CHECK(next == sampled.size(), "no sampled token is left over");
}

void Scheduler::CopiesCompleted(uint64_t ticket) {
  INFERD_CHECK(ticket <= last_ticket_, "only batches that were asked for complete");
  completed_ticket_ = std::max(completed_ticket_, ticket);
  capacity_.CopiesCompleted(completed_ticket_);
}

void Scheduler::Finish(Sequence* seq) {
  auto drop = [seq](std::deque<Sequence*>& q) {
    auto it = std::find(q.begin(), q.end(), seq);
    if (it != q.end()) q.erase(it);
  };
  drop(running_);
  drop(waiting_);
  capacity_.Finish(seq);
}

}  // namespace inferd

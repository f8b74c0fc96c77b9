#include "engine/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <climits>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "engine/runtime/step_input.h"
#include "engine/spec/verify.h"

namespace inferd {
namespace {

// Sequences are named by one letter; the fake "model" samples token 100 for everyone.
class SchedulerHarness {
 public:
  // swap_blocks > 0: host swap space of that many blocks; cache_blocks > 0: the prefix cache's host tier, that
  // many more. copy_delay: steps a copy batch takes to complete (0: done before the next step is planned).
  SchedulerHarness(SchedulerLimits limits, int32_t num_blocks, int32_t swap_blocks = 0, int32_t cache_blocks = 0,
                   int32_t copy_delay = 0)
      : pool_(num_blocks),
        swap_pool_(std::max(swap_blocks + cache_blocks, 1)),
        scheduler_(limits, &pool_, swap_blocks + cache_blocks > 0 ? &swap_pool_ : nullptr,
                   HostShares{.swap_blocks = swap_blocks, .cache = cache_blocks > 0}),
        copy_delay_(copy_delay) {}

  void Add(char name, int32_t prompt_len, int32_t priority = 0) {
    auto seq = std::make_unique<Sequence>();
    seq->seq_id = ++serial_;
    seq->arrival = now_;
    seq->request.priority = priority;
    seq->request.id = std::string(1, name);
    seq->tokens.assign(prompt_len, 7);
    seq->num_prompt_tokens = prompt_len;
    scheduler_.Add(seq.get());
    seqs_[name] = std::move(seq);
  }

  StepPlan Step() {
    copies_before_ = scheduler_.copies_in_flight();
    StepPlan plan = scheduler_.Schedule(now_);
    for (const ScheduledSeq& s : plan.seqs) EXPECT_FALSE(scheduler_.loading(*s.seq)) << "a loading sequence waits";
    std::vector<int32_t> sampled;
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.wants_token) sampled.push_back(100);
    }
    scheduler_.Update(plan, sampled);
    if (plan.copies.ticket > 0) started_.push_back({plan.copies.ticket, copy_delay_});
    // Batches complete in order, each copy_delay steps after it started.
    uint64_t done = 0;
    while (!started_.empty() && started_.front().second <= 0) {
      done = started_.front().first;
      started_.pop_front();
    }
    for (auto& [ticket, left] : started_) --left;
    if (done > 0) scheduler_.CopiesCompleted(done);
    pool_.CheckInvariants();
    swap_pool_.CheckInvariants();
    return plan;
  }

  void Finish(char name) {
    scheduler_.Finish(seqs_.at(name).get());
    seqs_.erase(name);
  }

  static std::string Names(const std::deque<Sequence*>& q) {
    std::string s;
    for (const Sequence* seq : q) s += seq->request.id;
    return s;
  }
  // "A6+ B2" = A computed 6 tokens and sampled; B computed 2 (prefill chunk).
  static std::string Describe(const StepPlan& plan) {
    std::string s;
    for (const ScheduledSeq& x : plan.seqs) {
      if (!s.empty()) s += ' ';
      s += x.seq->request.id + std::to_string(x.num_new) + (x.wants_token ? "+" : "");
    }
    return s;
  }

  BlockPool pool_;
  BlockPool swap_pool_;  // the host pool: swap space and the host tier
  Scheduler scheduler_;
  int32_t copy_delay_ = 0;
  std::deque<std::pair<uint64_t, int32_t>> started_;  // copy batches in flight: ticket, steps left
  uint64_t copies_before_ = 0;                        // in flight when the last step was planned
  std::map<char, std::unique_ptr<Sequence>> seqs_;
  absl::Time now_ = absl::UnixEpoch();  // the test moves the clock
  uint64_t serial_ = 0;
};

std::string PreemptedNames(const StepPlan& plan) {
  std::string s;
  for (const Sequence* seq : plan.preempted) s += seq->request.id;
  return s;
}

struct ExpectedStep {
  std::string scheduled;
  std::string preempted;
  std::string running;
  std::string waiting;
  int32_t free_blocks;
  char finish_after = 0;  // the test finishes this sequence after the step
};

TEST(Scheduler, StepTableWithChunkedPrefillHeadroomAndFinish) {
  // block_size 4, 6 blocks, at most 3 sequences and 8 tokens per step, no cap on one prompt's share.
  SchedulerHarness h({.max_num_seqs = 3, .max_num_batched_tokens = 8, .block_size = 4, .long_prefill_chunk = 8}, 6);
  h.Add('A', 6);
  h.Add('B', 5);
  h.Add('C', 3);
  const std::vector<ExpectedStep> table = {
      {"A6+ B2", "", "AB", "C", 3},        // A prefills whole; B gets the last 2 tokens of budget
      {"A1+ B3+", "", "AB", "C", 2},       // C's block would leave less than one free block per running one
      {"A1+ B1+", "", "AB", "C", 2},       // all decode; C still waits rather than be preempted later
      {"A1+ B1+", "", "AB", "C", 1},       // A takes its 3rd block: the headroom it was kept for
      {"A1+ B1+", "", "AB", "C", 1, 'A'},  // then A finishes
      {"B1+ C3+", "", "BC", "", 2},        // A's 3 blocks are back: B grows, C is admitted
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const ExpectedStep& e = table[i];
    const StepPlan plan = h.Step();
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(SchedulerHarness::Describe(plan), e.scheduled);
    EXPECT_EQ(PreemptedNames(plan), e.preempted);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.running()), e.running);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.waiting()), e.waiting);
    EXPECT_EQ(h.pool_.num_free(), e.free_blocks);
    if (e.finish_after) h.Finish(e.finish_after);
  }
  EXPECT_EQ(h.seqs_.at('C')->num_preemptions, 0);
  h.Finish('B');
  h.Finish('C');
  EXPECT_EQ(h.pool_.num_free(), 6) << "finished sequences return every block";
}

// Runs a table of steps: before each, the named sequences arrive (name, prompt length, priority).
struct Arrival {
  char name;
  int32_t prompt_len;
  int32_t priority = 0;
};
struct TableStep {
  std::vector<Arrival> arrive;
  std::string scheduled, preempted, running, waiting;
  int32_t free_blocks;
  int32_t cached_blocks = 0;
};
void RunTable(SchedulerHarness& h, const std::vector<TableStep>& table, absl::Duration tick = absl::Seconds(1)) {
  for (size_t i = 0; i < table.size(); ++i) {
    const TableStep& e = table[i];
    for (const Arrival& a : e.arrive) h.Add(a.name, a.prompt_len, a.priority);
    const StepPlan plan = h.Step();
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(SchedulerHarness::Describe(plan), e.scheduled);
    EXPECT_EQ(PreemptedNames(plan), e.preempted);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.running()), e.running);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.waiting()), e.waiting);
    EXPECT_EQ(h.pool_.num_free(), e.free_blocks);
    EXPECT_EQ(h.pool_.num_cached(), e.cached_blocks);
    h.now_ += tick;
  }
}

TEST(Scheduler, ALongPromptLeavesRoomForANewcomersFirstTokenEveryStep) {
  // 16 tokens per step, a prompt takes at most 4 of them while others wait; 40 blocks of 4.
  SchedulerHarness h({.max_num_seqs = 4, .max_num_batched_tokens = 16, .block_size = 4, .long_prefill_chunk = 4}, 40);
  RunTable(h, {
                  {{{'L', 60}}, "L16", "", "L", "", 36},     // alone, the long prompt takes the whole step
                  {{{'S', 3}}, "L4 S3+", "", "LS", "", 34},  // a newcomer: L is capped, S gets its token now
                  {{}, "L15 S1+", "", "LS", "", 30},  // S's decode comes first; with nobody waiting L takes the rest
                  {{{'T', 2}, {'U', 2}}, "L4 S1+ T2+ U2+", "", "LSTU", "", 26},  // two more, both in one step
                  {{}, "L13 S1+ T1+ U1+", "", "LSTU", "", 23},
                  {{}, "L8+ S1+ T1+ U1+", "", "LSTU", "", 21},  // L's last chunk samples
              });
}

TEST(Scheduler, HigherPriorityOvertakesTheQueueAndPreemptsLowerOnesForASlot) {
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4}, 20);
  RunTable(h, {
                  {{{'A', 4}, {'B', 4}, {'C', 4}}, "A4+ B4+", "", "AB", "C", 18},
                  {{{'H', 4, 5}}, "A1+ H4+", "B", "AH", "BC", 17},   // H takes a slot from B (lower, most recent)
                  {{{'I', 4, 5}}, "H1+ I4+", "A", "HI", "ABC", 17},  // I takes A's: running order is by priority
                  {{{'J', 4, 1}}, "H1+ I1+", "", "HI", "JABC", 16},  // J may displace neither (not lower than J)
              });
  // H finishes: J goes first (priority), then the preempted ones in arrival order.
  h.Finish('H');
  RunTable(h, {{{}, "I1+ J4+", "", "IJ", "ABC", 17}});
  EXPECT_EQ(h.seqs_.at('A')->num_preemptions, 1);
  EXPECT_EQ(h.seqs_.at('B')->num_preemptions, 1);
}

TEST(Scheduler, WaitingRaisesPriorityWithAgingSoLowOnesDoNotStarve) {
  // One sequence at a time; aging: one level per 10 s of waiting; the clock moves 1 s per step.
  SchedulerHarness h({.max_num_seqs = 1,
                      .max_num_batched_tokens = 8,
                      .block_size = 4,
                      .long_prefill_chunk = 8,
                      .priority_aging_s = 10},
                     8);
  h.Add('R', 4, 9);  // outranks everyone: never displaced
  h.Step();
  h.Add('L', 4, 0);  // arrives at t = 1
  h.now_ += absl::Seconds(1);
  for (int t = 2; t < 12; ++t) {
    h.now_ = absl::UnixEpoch() + absl::Seconds(t);
    h.Add(static_cast<char>('a' + t), 4, 1);  // a higher-priority newcomer every second
    h.Step();
  }
  // At t = 11 L has waited 10 s: level 1, as high as every newcomer's, and it arrived first.
  h.Finish('R');
  h.now_ = absl::UnixEpoch() + absl::Seconds(11);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "L4+");
}

// prompt_logprobs: a scoring sequence computes at most as many prompt tokens a step as the step has prompt rows
// left (max_num_seqs), reuses no cached prefix, and a position scored once is not scored again after a preemption.
TEST(Scheduler, PromptRowsCapAScoringSequencesChunksAndAreNeverScoredTwice) {
  SchedulerHarness h({.max_num_seqs = 3, .max_num_batched_tokens = 32, .block_size = 4, .prefix_caching = true}, 16);
  h.Add('A', 9);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "A9+");  // caches blocks [0, 8)
  h.Finish('A');
  h.Add('B', 9);  // the same 9 tokens, scored
  h.seqs_.at('B')->request.prompt_logprobs = 0;
  h.Add('C', 5);
  std::vector<std::string> steps;
  std::vector<int32_t> rows;
  for (int i = 0; i < 4; ++i) {
    const StepPlan plan = h.Step();
    steps.push_back(SchedulerHarness::Describe(plan));
    rows.push_back(plan.num_prompt_rows);
    EXPECT_LE(BuildStepInput(plan, 4).num_logits(), 2 * 3) << "a sampled row per sequence and 3 prompt rows";
  }
  // B scores positions 0..7 (tokens 1..8) three rows a step; C, not scoring, reuses A's first block.
  EXPECT_EQ(steps, (std::vector<std::string>{"B3 C1+", "B3 C1+", "B3+ C1+", "B1+ C1+"}));
  EXPECT_EQ(h.seqs_.at('C')->num_cached_tokens, 4);
  EXPECT_EQ(rows, (std::vector<int32_t>{3, 3, 2, 0}));
  const Sequence& b = *h.seqs_.at('B');
  EXPECT_EQ(b.num_cached_tokens, 0) << "a scoring sequence computes its whole prompt";
  EXPECT_EQ(b.num_scored, 8);
  EXPECT_FALSE(b.scoring());
  h.Finish('B');
  h.Finish('C');
  h.Add('D', 7);
  Sequence& d = *h.seqs_.at('D');
  d.request.prompt_logprobs = 2;
  const StepPlan first = h.scheduler_.Schedule(h.now_);
  const StepInput in = BuildStepInput(first, 4);
  EXPECT_EQ(in.logits_indices, (std::vector<int32_t>{0, 1, 2})) << "3 prompt rows, no sampled row yet";
  h.scheduler_.Update(first, {});
  EXPECT_EQ(d.num_scored, 3);
  // Preempted (recompute) after scoring 3 positions: they are computed again, without rows.
  h.scheduler_.Finish(&d);
  d.num_computed = 0;
  d.block_tables.clear();
  d.block_keys.clear();
  h.scheduler_.Add(&d);
  const StepPlan again = h.scheduler_.Schedule(h.now_);
  EXPECT_EQ(SchedulerHarness::Describe(again), "D6");
  EXPECT_EQ(BuildStepInput(again, 4).logits_indices, (std::vector<int32_t>{3, 4, 5})) << "positions 3..5 only";
  h.scheduler_.Update(again, {});
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "D1+");
  EXPECT_EQ(d.num_scored, 6);
  h.pool_.CheckInvariants();
}

TEST(Scheduler, PreemptionTakesTheMostRecentAndCountsTheWorkLost) {
  // 4 blocks of 4; A and B grow until they collide.
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4, .long_prefill_chunk = 16}, 4);
  RunTable(h, {
                  {{{'A', 3}, {'B', 3}}, "A3+ B3+", "", "AB", "", 2},
                  {{}, "A1+ B1+", "", "AB", "", 2},
                  {{}, "A1+ B1+", "", "AB", "", 0},  // both take their 2nd block
                  {{}, "A1+ B1+", "", "AB", "", 0},
                  {{}, "A1+ B1+", "", "AB", "", 0},
                  {{}, "A1+ B1+", "", "AB", "", 0},
                  {{}, "A1+", "B", "A", "B", 1},  // A needs a 3rd block: B (more recent) goes, 8 tokens lost
                  {{}, "A1+", "", "A", "B", 1},   // B needs 3 blocks and one spare: it waits
              });
  h.Finish('A');
  RunTable(h, {{{}, "B9+", "", "B", "", 1}});
  const Sequence& b = *h.seqs_.at('B');
  EXPECT_EQ(b.num_tokens(), 10);
  EXPECT_FALSE(b.awaiting_progress()) << "it sampled a token past the one it was preempted at";
  EXPECT_EQ(h.scheduler_.counters().preemptions, 1);
  EXPECT_EQ(h.scheduler_.counters().preempted_tokens, 8);
}

TEST(Scheduler, SwapPreemptionKeepsTheKvOnTheHostAndResumesWithoutRecomputing) {
  // The collision of PreemptionTakesTheMostRecent..., now with 4 blocks of host swap space.
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4, .long_prefill_chunk = 16}, 4,
                     4);
  RunTable(h, {
                  {{{'A', 3}, {'B', 3}}, "A3+ B3+", "", "AB", "", 2},
                  {{}, "A1+ B1+", "", "AB", "", 2},
                  {{}, "A1+ B1+", "", "AB", "", 0},
                  {{}, "A1+ B1+", "", "AB", "", 0},
                  {{}, "A1+ B1+", "", "AB", "", 0},
                  {{}, "A1+ B1+", "", "AB", "", 0},
              });
  const std::vector<int32_t> b_blocks = h.seqs_.at('B')->block_tables[0];
  StepPlan plan = h.Step();  // A needs a 3rd block: B goes to the host, both of its computed blocks
  EXPECT_EQ(SchedulerHarness::Describe(plan), "A1+");
  EXPECT_EQ(PreemptedNames(plan), "B");
  ASSERT_EQ(plan.copies.out.size(), 2u);
  EXPECT_EQ(plan.copies.out[0].device_block, b_blocks[0]);
  EXPECT_EQ(plan.copies.out[1].device_block, b_blocks[1]);
  const Sequence& b = *h.seqs_.at('B');
  EXPECT_EQ(b.num_computed, 8) << "nothing is lost";
  ASSERT_EQ(b.swapped_blocks.size(), 1u) << "one KV group";
  EXPECT_EQ(b.swapped_blocks[0].size(), 2u);
  EXPECT_EQ(h.swap_pool_.num_free(), 2);
  h.Finish('A');
  plan = h.Step();  // B comes back: its 8 tokens are copied in while it loads
  EXPECT_EQ(SchedulerHarness::Describe(plan), "");
  EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.running()), "B");
  ASSERT_EQ(plan.copies.in.size(), 2u);
  EXPECT_EQ(plan.copies.in[0].device_block, b.block_tables[0][0]);
  EXPECT_EQ(plan.copies.in[1].device_block, b.block_tables[0][1]);
  EXPECT_EQ(h.swap_pool_.num_free(), 4) << "the copies completed: the host blocks are free";
  plan = h.Step();
  EXPECT_EQ(SchedulerHarness::Describe(plan), "B1+") << "it computes only its 9th";
  EXPECT_EQ(h.scheduler_.counters().swapped_preemptions, 1);
  EXPECT_EQ(h.scheduler_.counters().preempted_tokens, 0);
}

TEST(Scheduler, WithoutRoomInSwapSpacePreemptionRecomputes) {
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4, .long_prefill_chunk = 16}, 4,
                     1);
  h.Add('A', 3);
  h.Add('B', 3);
  for (int i = 0; i < 6; ++i) h.Step();
  const StepPlan plan = h.Step();
  EXPECT_EQ(PreemptedNames(plan), "B");
  EXPECT_TRUE(plan.copies.out.empty()) << "B's 2 blocks do not fit 1 block of swap space";
  EXPECT_EQ(h.seqs_.at('B')->num_computed, 0);
  EXPECT_EQ(h.scheduler_.counters().preempted_tokens, 8);
}

TEST(Scheduler, AbortingASwappedOutSequenceFreesItsHostBlocks) {
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4, .long_prefill_chunk = 16}, 4,
                     4);
  h.Add('A', 3);
  h.Add('B', 3);
  for (int i = 0; i < 7; ++i) h.Step();
  ASSERT_EQ(h.seqs_.at('B')->swapped_blocks.size(), 1u);
  ASSERT_EQ(h.seqs_.at('B')->swapped_blocks[0].size(), 2u);
  h.Finish('B');
  EXPECT_EQ(h.swap_pool_.num_free(), 4);
  h.Finish('A');
  EXPECT_EQ(h.pool_.num_free(), 4);
}

// The prefix cache's host tier: a finished request's full blocks stay cached on the device and are written back
// to the host ahead of their eviction (or, without write-ahead, when evicted); once evicted, the same prompt finds
// them on the host, loads them while it waits, then computes only its last token.
TEST(Scheduler, HostTierWritesEvictedPrefixBlocksBackAndRestoresThem) {
  for (const int32_t write_ahead : {0, 4}) {
    SCOPED_TRACE(write_ahead);
    SchedulerHarness h({.max_num_seqs = 2,
                        .max_num_batched_tokens = 32,
                        .block_size = 4,
                        .prefix_caching = true,
                        .long_prefill_chunk = 32,
                        .write_ahead_blocks = write_ahead},
                       6, 0, 8);
    h.Add('A', 9);  // 2 full blocks and a partial one
    EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "A9+");
    h.Finish('A');
    EXPECT_EQ(h.pool_.num_cached(), 2);
    StepPlan plan = h.Step();  // nothing runs
    EXPECT_EQ(plan.copies.out.size(), write_ahead > 0 ? 2u : 0u) << "written back ahead of eviction";
    h.Add('B', 20);  // other tokens, 6 blocks: evicts A's
    for (int32_t& t : h.seqs_.at('B')->tokens) t = 8;
    plan = h.Step();
    EXPECT_EQ(SchedulerHarness::Describe(plan), "B20+");
    EXPECT_EQ(plan.copies.out.size(), write_ahead > 0 ? 0u : 2u) << "written back as they are evicted";
    EXPECT_EQ(h.pool_.num_cached(), 0);
    EXPECT_EQ(h.swap_pool_.num_cached(), 2) << "the host tier holds A's 2 full blocks";
    EXPECT_EQ(h.scheduler_.counters().offloaded_blocks, 2);
    h.Finish('B');
    h.Add('C', 9);  // A's prompt again
    plan = h.Step();
    EXPECT_EQ(SchedulerHarness::Describe(plan), "") << "C loads its 2 blocks from the host";
    ASSERT_EQ(plan.copies.in.size(), 2u);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.running()), "C");
    EXPECT_EQ(h.seqs_.at('C')->num_computed, 8);
    plan = h.Step();
    EXPECT_EQ(SchedulerHarness::Describe(plan), "C1+") << "then computes only its 9th token";
    EXPECT_EQ(h.scheduler_.counters().host_hit_tokens, 8);
    EXPECT_EQ(h.scheduler_.counters().prefix_hit_tokens, 8);
    EXPECT_EQ(h.scheduler_.counters().restored_blocks, 2);
    h.Finish('C');
    EXPECT_EQ(h.pool_.num_free(), 6);
    EXPECT_EQ(h.swap_pool_.num_free(), 8);
  }
}

TEST(Capacity, VictimsAreTheLowestPriorityThenMostRecentSparingThoseAwaitingProgress) {
  Sequence x, y, z;
  x.admitted_order = 1;
  y.admitted_order = 2;
  z.admitted_order = 3;
  z.request.priority = 1;
  y.tokens = {1, 2, 3};
  y.num_preemptions = 1;
  y.tokens_at_preemption = 3;  // preempted at 3 tokens and not past them yet
  ASSERT_TRUE(y.awaiting_progress());
  const std::vector<Sequence*> all = {&x, &y, &z};
  EXPECT_EQ(Capacity::ChooseVictim(all, nullptr, INT32_MAX), &x) << "y is spared, z outranks";
  EXPECT_EQ(Capacity::ChooseVictim(all, nullptr, INT32_MAX, /*spare_awaiting=*/false), &y);
  EXPECT_EQ(Capacity::ChooseVictim(all, &x, INT32_MAX), &z) << "never the sequence that needs the room";
  EXPECT_EQ(Capacity::ChooseVictim(all, nullptr, 0), nullptr) << "only priorities below 0";
  y.tokens.push_back(4);
  EXPECT_EQ(Capacity::ChooseVictim(all, nullptr, INT32_MAX), &y) << "past its preemption point, the most recent";
}

TEST(Scheduler, WhenOnlySequencesAwaitingProgressCanMakeRoomTheLowestGoesAnyway) {
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4}, 3);
  h.Add('A', 4, 0);
  h.Add('B', 4, 1);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "B4+ A4+");
  const std::vector<int32_t> taken = h.pool_.Allocate(1);  // the last free block goes elsewhere
  Sequence& a = *h.seqs_.at('A');
  Sequence& b = *h.seqs_.at('B');
  for (Sequence* s : {&a, &b}) {  // as if both had just come back from a preemption
    s->num_preemptions = 1;
    s->tokens_at_preemption = s->num_tokens();
  }
  ASSERT_TRUE(a.awaiting_progress() && b.awaiting_progress());
  const StepPlan plan = h.Step();  // both need a 2nd block; none is free
  EXPECT_EQ(PreemptedNames(plan), "A") << "rather than stand still, the lower priority goes";
  EXPECT_EQ(SchedulerHarness::Describe(plan), "B1+");
  h.pool_.Free(taken);
}

TEST(Scheduler, AbortWhileWaitingFreesNothingAndLeavesQueue) {
  SchedulerHarness h({.max_num_seqs = 1, .max_num_batched_tokens = 16, .block_size = 4}, 4);
  h.Add('A', 4);
  h.Add('B', 4);
  h.Step();
  EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.waiting()), "B");
  h.Finish('B');
  EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.waiting()), "");
  h.Finish('A');
  EXPECT_EQ(h.pool_.num_free(), 4);
}

// A model with sliding windows: a global KV group and one of window 8 (block_size 4). The window group lets go of
// the blocks no position to come attends to; the global group keeps every block.
TEST(Scheduler, AWindowGroupLetsGoOfBlocksBehindItsWindow) {
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 32, .block_size = 4, .kv_windows = {0, 8}}, 32);
  h.Add('A', 20);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "A20+");
  const Sequence& a = *h.seqs_.at('A');
  EXPECT_EQ(h.pool_.num_free(), 32 - 2 * 5) << "the prompt's 5 blocks in both groups";
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "A1+");  // position 20 sees 13..20: blocks 3..5
  EXPECT_EQ(a.block_tables[1], (std::vector<int32_t>{kNoBlock, kNoBlock, kNoBlock, 8, 9, 11}));
  EXPECT_EQ(a.block_tables[0].size(), 6u);
  for (int i = 0; i < 8; ++i) h.Step();  // positions 21..28
  // Position 28 sees 21..28 (blocks 5..7); the global group holds all 8 blocks.
  EXPECT_EQ(Capacity::HeldBlocks({a.block_tables[1]}).size(), 3u);
  EXPECT_EQ(Capacity::HeldBlocks({a.block_tables[0]}).size(), 8u);
  EXPECT_EQ(h.pool_.num_free(), 32 - 11);
  h.Finish('A');
  EXPECT_EQ(h.pool_.num_free(), 32);
}

// The blocks a window group let go stay cached: a second request with the same prompt finds the global group's
// blocks and, of the window group's, those its window reaches back to from the first position it computes.
TEST(Scheduler, PrefixReuseWithWindowsTakesTheWindowBehindTheHit) {
  SchedulerHarness h(
      {.max_num_seqs = 2, .max_num_batched_tokens = 32, .block_size = 4, .prefix_caching = true, .kv_windows = {0, 8}},
      32);
  h.Add('A', 20);
  h.Step();
  h.Step();  // A lets go of window blocks 0..2 (cached)
  const Sequence& a = *h.seqs_.at('A');
  ASSERT_EQ(a.block_tables[1][2], kNoBlock);
  h.Add('B', 20);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "A1+ B4+") << "B reuses 16 tokens (the last one is computed)";
  const Sequence& b = *h.seqs_.at('B');
  EXPECT_EQ(b.num_cached_tokens, 16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.block_tables[0][i], a.block_tables[0][i]) << "global block " << i;
  // Position 16 sees 9..16: window blocks 2 (cached, let go by A) and 3 (A's); 0 and 1 are not taken.
  EXPECT_EQ(b.block_tables[1][0], kNoBlock);
  EXPECT_EQ(b.block_tables[1][1], kNoBlock);
  EXPECT_NE(b.block_tables[1][2], kNoBlock);
  EXPECT_EQ(b.block_tables[1][3], a.block_tables[1][3]);
  EXPECT_EQ(h.pool_.RefCount(b.block_tables[1][3]), 2);
  h.Finish('A');
  h.Finish('B');
  EXPECT_EQ(h.pool_.num_free(), 32);
}

TEST(Scheduler, PrefixCachingReusesFullBlocksOfAKnownPrefix) {
  // block_size 4, 8 blocks. Every prompt is token 7 repeated, so equal lengths share their prefix.
  SchedulerHarness h({.max_num_seqs = 4, .max_num_batched_tokens = 32, .block_size = 4, .prefix_caching = true}, 8);
  h.Add('A', 10);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "A10+");  // 3 blocks; blocks 0 and 1 are full and cached
  EXPECT_EQ(h.pool_.num_free(), 5);
  h.Add('B', 10);
  const StepPlan plan = h.Step();
  EXPECT_EQ(SchedulerHarness::Describe(plan), "A1+ B2+") << "B reuses 8 cached tokens and computes only 2";
  const Sequence& a = *h.seqs_.at('A');
  const Sequence& b = *h.seqs_.at('B');
  EXPECT_EQ(b.num_cached_tokens, 8);
  EXPECT_EQ(b.block_tables[0][0], a.block_tables[0][0]);
  EXPECT_EQ(b.block_tables[0][1], a.block_tables[0][1]);
  EXPECT_NE(b.block_tables[0][2], a.block_tables[0][2]) << "the partly filled block is never shared";
  EXPECT_EQ(h.pool_.RefCount(a.block_tables[0][0]), 2);
  EXPECT_EQ(h.pool_.num_free(), 4);
  // Both finish: every block is free again, the full ones still cached for the next request.
  h.Finish('A');
  h.Finish('B');
  EXPECT_EQ(h.pool_.num_free(), 8);
  EXPECT_GT(h.pool_.num_cached(), 0);
  h.Add('C', 9);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "C1+") << "8 of C's 9 tokens are cached";
  EXPECT_EQ(h.seqs_.at('C')->num_cached_tokens, 8);
  // A prompt that is exactly the cached blocks still computes its last token itself (it samples).
  h.Add('D', 8);
  EXPECT_EQ(SchedulerHarness::Describe(h.Step()), "C1+ D4+");
  EXPECT_EQ(h.seqs_.at('D')->num_cached_tokens, 4);
  h.pool_.CheckInvariants();
}

// The events a pool records are what a subscriber needs to know which keys it holds: one kStored per key it starts
// holding (with the parent key and tokens), none for a key already held, one kRemoved per key it evicts.
TEST(BlockPool, RecordsAStoredEventPerNewKeyAndARemovedEventPerEviction) {
  BlockPool pool(2);
  std::vector<KvCacheEvent> events;
  pool.RecordEvents(&events, /*host=*/true);
  const std::vector<int32_t> blocks = pool.Allocate(2);
  const std::vector<int32_t> t0 = {1, 2}, t1 = {3, 4};
  const uint64_t k0 = BlockPool::BlockKey(0, t0), k1 = BlockPool::BlockKey(k0, t1);
  pool.Remember(blocks[0], k0, 0, t0);
  pool.Remember(blocks[1], k0, 0, t0);   // a second block with a known key: not findable, no event
  pool.Remember(blocks[0], k1, k0, t1);  // a block that already holds a key keeps it
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kStored);
  EXPECT_EQ(events[0].key, k0);
  EXPECT_EQ(events[0].parent, 0u);
  EXPECT_EQ(events[0].tokens, t0);
  EXPECT_TRUE(events[0].host);
  pool.Remember(blocks[1], k1, k0, t1);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].parent, k0);
  pool.Free(blocks);
  events.clear();
  const std::vector<int32_t> again = pool.Allocate(2);  // evicts both, oldest first
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].key, k0);
  EXPECT_EQ(events[1].key, k1);
  pool.Free(again);
  pool.CheckInvariants();
}

TEST(BlockPool, EvictsTheLeastRecentlyFreedCachedBlockFirstAndNeverAWrongOne) {
  BlockPool pool(3);
  const std::vector<int32_t> blocks = pool.Allocate(3);
  const std::vector<int32_t> t0 = {1, 2}, t1 = {3, 4}, t2 = {5, 6};
  const uint64_t k0 = BlockPool::BlockKey(0, t0), k1 = BlockPool::BlockKey(k0, t1), k2 = BlockPool::BlockKey(0, t2);
  pool.Remember(blocks[0], k0, 0, t0);
  pool.Remember(blocks[1], k1, k0, t1);
  pool.Remember(blocks[2], k2, 0, t2);
  pool.Free(std::vector<int32_t>{blocks[2]});
  pool.Free(std::vector<int32_t>{blocks[0]});
  pool.Free(std::vector<int32_t>{blocks[1]});
  EXPECT_EQ(pool.num_cached(), 3);
  const std::vector<int32_t> one = pool.Allocate(1);
  EXPECT_EQ(one[0], blocks[2]) << "the least recently freed goes first";
  EXPECT_FALSE(pool.Reuse(k2, t2).has_value()) << "an evicted block's prefix is gone";
  EXPECT_FALSE(pool.Reuse(k0, t1).has_value()) << "a key with other tokens is never handed out";
  auto again = pool.Reuse(k0, t0);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, blocks[0]);
  EXPECT_EQ(pool.num_free(), 1);
  pool.CheckInvariants();
}

// (prefix caching, swap space, the prefix cache's host tier, steps a copy batch takes)
// prefix caching, swap space, the host tier, copy delay (steps), and sliding windows (a global KV group and two of
// window 8, as a Gemma-like model's layers form them).
class RandomizedScheduler : public ::testing::TestWithParam<std::tuple<bool, bool, bool, int32_t, bool>> {};

TEST_P(RandomizedScheduler, ArrivalsAndFinishesNeverLeakAndAlwaysProgress) {
  std::mt19937 rng(42);
  const bool windows = std::get<4>(GetParam());
  const SchedulerLimits limits{.max_num_seqs = 5,
                               .max_num_batched_tokens = 24,
                               .block_size = 4,
                               .prefix_caching = std::get<0>(GetParam()),
                               .long_prefill_chunk = 6,
                               .priority_aging_s = 5,
                               .kv_windows = windows ? std::vector<int32_t>{0, 8, 8} : std::vector<int32_t>{0}};
  const bool host_tier = std::get<2>(GetParam());
  // The pool holds the longest sequence alone: 18 blocks, and with windows 9 more in each window group.
  SchedulerHarness h(limits, windows ? 40 : 20, std::get<1>(GetParam()) ? 12 : 0, host_tier ? 10 : 0,
                     std::get<3>(GetParam()));
  const Capacity& capacity = h.scheduler_.capacity();
  std::map<char, int32_t> target;  // total length at which the test finishes the sequence
  char next = 'A';
  int finished = 0;
  int64_t preemptions = 0, swapped = 0, restored = 0;
  for (int step = 0; step < 3000 && finished < 200; ++step) {
    if (h.seqs_.size() < 12 && rng() % 3 == 0) {
      const char name = static_cast<char>('A' + (next++ - 'A') % 52);
      if (!h.seqs_.count(name)) {
        const int32_t prompt = 1 + static_cast<int32_t>(rng() % 30);
        h.Add(name, prompt, static_cast<int32_t>(rng() % 3));
        target[name] = prompt + 1 + static_cast<int32_t>(rng() % 40);       // ≤ 71 tokens = 18 blocks ≤ pool
        if (rng() % 4 == 0) h.seqs_.at(name)->request.prompt_logprobs = 0;  // scores its prompt
      }
    }
    h.now_ += absl::Milliseconds(rng() % 1000);
    const StepPlan plan = h.Step();
    preemptions += static_cast<int64_t>(plan.preempted.size());
    ASSERT_EQ(h.scheduler_.counters().preemptions, preemptions);
    ASSERT_LE(plan.num_tokens, limits.max_num_batched_tokens);
    ASSERT_LE(BuildStepInput(plan, limits.block_size, capacity.num_groups()).num_logits(), 2 * limits.max_num_seqs);
    // A step's sequence holds every block it reads or writes, in every KV group, and a window group nothing behind
    // its window.
    for (const ScheduledSeq& s : plan.seqs) {
      ASSERT_EQ(static_cast<int32_t>(s.seq->block_tables.size()), capacity.num_groups());
      for (int32_t g = 0; g < capacity.num_groups(); ++g) {
        const std::vector<int32_t>& table = s.seq->block_tables[g];
        const int32_t first = capacity.FirstNeeded(g, s.start), end = BlocksFor(s.start + s.num_new, 4);
        ASSERT_GE(static_cast<int32_t>(table.size()), end);
        for (int32_t i = 0; i < end; ++i) {
          ASSERT_EQ(table[i] != kNoBlock, i >= first) << s.seq->request.id << " group " << g << " block " << i;
        }
      }
    }
    // Every live sequence is in exactly one queue, and only running ones hold blocks.
    ASSERT_EQ(h.scheduler_.running().size() + h.scheduler_.waiting().size(), h.seqs_.size());
    for (const Sequence* seq : h.scheduler_.waiting()) {
      ASSERT_TRUE(Capacity::HeldBlocks(seq->block_tables).empty()) << seq->request.id;
    }
    // Host blocks: each held by one swapped-out sequence, or by copy batches in flight (a host-tier block may be
    // read by several), within the swap share; the rest free (cached or not).
    std::map<int32_t, int32_t> host_holders;
    int32_t swap_held = 0;
    for (const auto& [name, seq] : h.seqs_) {
      for (int32_t b : Capacity::HeldBlocks(seq->swapped_blocks)) {
        ASSERT_EQ(++host_holders[b], 1) << "host block " << b << " held twice";
      }
      swap_held += static_cast<int32_t>(Capacity::HeldBlocks(seq->swapped_blocks).size());
      ASSERT_TRUE(seq->restoring.empty()) << "host-tier blocks are copied in or given back within a step";
    }
    ASSERT_EQ(h.scheduler_.capacity().swap_blocks_held(), swap_held);
    ASSERT_LE(swap_held, std::get<1>(GetParam()) ? 12 : 0);
    for (int32_t b : h.scheduler_.capacity().host_blocks_in_flight()) ++host_holders[b];
    for (const auto& [b, n] : host_holders) ASSERT_EQ(h.swap_pool_.RefCount(b), n) << "host block " << b;
    ASSERT_EQ(static_cast<int32_t>(host_holders.size()) + h.swap_pool_.num_free(), h.swap_pool_.num_total());
    restored += static_cast<int64_t>(plan.copies.in.size());
    swapped += static_cast<int64_t>(plan.copies.out.size());
    ASSERT_LE(static_cast<int32_t>(plan.seqs.size()), limits.max_num_seqs);
    if (!h.seqs_.empty()) {
      // (or waits for KV on its way in, which the step's planning saw in flight)
      ASSERT_TRUE(!plan.empty() || !plan.copies.empty() || h.copies_before_ > 0)
          << "a non-empty scheduler always makes progress: running " << SchedulerHarness::Names(h.scheduler_.running())
          << ", waiting " << SchedulerHarness::Names(h.scheduler_.waiting()) << ", free blocks " << h.pool_.num_free()
          << ", preempted " << PreemptedNames(plan) << ", step " << step;
    }
    std::map<int32_t, int32_t> holders;  // block -> sequences holding it (shared prefix blocks: several)
    for (const auto& [name, seq] : h.seqs_)
      for (int32_t b : Capacity::HeldBlocks(seq->block_tables)) holders[b]++;
    for (const auto& [b, n] : holders) ASSERT_EQ(h.pool_.RefCount(b), n) << "block " << b;
    ASSERT_EQ(static_cast<int32_t>(holders.size()) + h.pool_.num_free(), h.pool_.num_total())
        << "every block is held or free";
    std::vector<char> done;
    for (const auto& [name, seq] : h.seqs_) {
      if (seq->num_tokens() >= target[name] && seq->num_computed == seq->num_tokens() - 1) {
        // A scoring sequence scored every prompt position once it sampled.
        if (seq->request.prompt_logprobs) {
          ASSERT_EQ(seq->num_scored, seq->num_prompt_tokens - 1) << name;
        }
        done.push_back(name);
      } else if (rng() % 200 == 0)
        done.push_back(name);  // aborts at random
    }
    for (char name : done) {
      h.Finish(name);
      ++finished;
    }
  }
  EXPECT_GE(finished, 200);
  EXPECT_GT(preemptions, 0) << "the pool is small enough that the run exercises preemption";
  if (std::get<1>(GetParam())) {
    EXPECT_GT(swapped, 0) << "and swapping";
  }
  if (host_tier) {
    EXPECT_GT(h.scheduler_.counters().offloaded_blocks, 0) << "evicted prefix blocks go to the host tier";
    EXPECT_GT(h.scheduler_.counters().restored_blocks, 0) << "and come back";
    EXPECT_GT(h.scheduler_.counters().host_hit_tokens, 0);
  }
  EXPECT_GE(restored, h.scheduler_.counters().restored_blocks + h.scheduler_.counters().swapped_in_blocks);
  for (auto it = h.seqs_.begin(); it != h.seqs_.end();) h.Finish((it++)->first);
  h.scheduler_.CopiesCompleted(h.scheduler_.copies_in_flight());
  EXPECT_EQ(h.pool_.num_free(), h.pool_.num_total());
  EXPECT_EQ(h.swap_pool_.num_free(), h.swap_pool_.num_total()) << "no host block leaked";
}

// Speculative decoding's steps at random: decoding sequences draft 0-4 tokens (the scheduler grants what the budget,
// the step's rows and the blocks allow), each step's rows sample at random from a 3-token alphabet (prompts too, so
// prefixes repeat and the prefix cache hits), drafts are kept while they match, requests are cancelled between a
// step's launch and its verification, and a small pool preempts and swaps. A simulated KV store records what each
// step and copy writes to each slot (drafts included): at every step, every computed position of every sequence —
// running, reusing cached prefix blocks, or swapped out — holds its own token, so no block whose KV holds an
// unverified draft is ever cached or read; and no block leaks.
TEST_P(RandomizedScheduler, DraftsCheckedInOneStepNeitherLeakBlocksNorLeaveUnverifiedKvToBeRead) {
  std::mt19937 rng(7);
  const bool windows = std::get<4>(GetParam());
  const int32_t bs = 4;
  const SchedulerLimits limits{.max_num_seqs = 5,
                               .max_num_batched_tokens = 24,
                               .block_size = bs,
                               .prefix_caching = std::get<0>(GetParam()),
                               .long_prefill_chunk = 6,
                               .kv_windows = windows ? std::vector<int32_t>{0, 8, 8} : std::vector<int32_t>{0}};
  const int32_t num_blocks = windows ? 40 : 20, swap_blocks = std::get<1>(GetParam()) ? 12 : 0,
                cache_blocks = std::get<2>(GetParam()) ? 10 : 0;
  SchedulerHarness h(limits, num_blocks, swap_blocks, cache_blocks);
  const int32_t copy_delay = std::get<3>(GetParam());
  std::vector<int32_t> kv(num_blocks * bs, -1), host((swap_blocks + cache_blocks + 1) * bs, -1);
  const auto token = [&] { return 1 + static_cast<int32_t>(rng() % 3); };
  std::map<char, int32_t> target;
  char next = 'A';
  int finished = 0;
  int64_t drafted = 0, accepted = 0;
  for (int step = 0; step < 3000 && finished < 200; ++step) {
    if (h.seqs_.size() < 12 && rng() % 3 == 0) {
      const char name = static_cast<char>('A' + (next++ - 'A') % 52);
      if (!h.seqs_.count(name)) {
        const int32_t prompt = 1 + static_cast<int32_t>(rng() % 30);
        h.Add(name, prompt);
        for (int32_t& t : h.seqs_.at(name)->tokens) t = 1 + static_cast<int32_t>(rng() % 2);  // prefixes repeat
        target[name] = prompt + 1 + static_cast<int32_t>(rng() % 40);
      }
    }
    for (Sequence* seq : h.scheduler_.running()) {
      seq->drafts.clear();
      if (seq->num_tokens() - seq->num_computed != 1) continue;
      for (int32_t i = static_cast<int32_t>(rng() % 5); i > 0; --i) seq->drafts.push_back(token());
    }
    h.copies_before_ = h.scheduler_.copies_in_flight();
    const StepPlan plan = h.scheduler_.Schedule(h.now_);
    ASSERT_LE(plan.num_tokens, limits.max_num_batched_tokens);
    ASSERT_LE(BuildStepInput(plan, bs, h.scheduler_.capacity().num_groups()).num_logits(), 2 * limits.max_num_seqs);
    // The copies, then the step's K/V (its drafts' too) where its block tables put them.
    for (const BlockCopy& c : plan.copies.out) {
      std::copy_n(kv.begin() + c.device_block * bs, bs, host.begin() + c.host_block * bs);
    }
    for (const BlockCopy& c : plan.copies.in) {
      std::copy_n(host.begin() + c.host_block * bs, bs, kv.begin() + c.device_block * bs);
    }
    for (const ScheduledSeq& s : plan.seqs) {
      std::vector<int32_t> ids = s.seq->tokens;
      ids.insert(ids.end(), s.seq->drafts.begin(), s.seq->drafts.begin() + s.num_drafts);
      for (int32_t p = s.start; p < s.start + s.num_new; ++p) {
        for (const std::vector<int32_t>& table : s.seq->block_tables) {
          if (table[p / bs] != kNoBlock) kv[table[p / bs] * bs + p % bs] = ids[p];
        }
      }
      drafted += s.num_drafts;
    }
    h.scheduler_.Launched(plan);
    // A cancel may land between the launch and the step's tokens.
    for (const ScheduledSeq& s : plan.seqs) {
      if (rng() % 50 == 0) {
        h.Finish(s.seq->request.id[0]);
        ++finished;
      }
    }
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.wants_token) continue;
      const auto it =
          std::find_if(h.seqs_.begin(), h.seqs_.end(), [&](const auto& e) { return e.second.get() == s.seq; });
      if (it == h.seqs_.end()) continue;  // cancelled
      std::vector<int32_t> sampled(s.num_drafts + 1);
      for (int32_t& t : sampled) t = token();
      const Verified v = VerifyDrafts(sampled, std::span<const int32_t>(s.seq->drafts).first(s.num_drafts));
      std::vector<int32_t> kept(s.seq->drafts.begin(), s.seq->drafts.begin() + v.accepted);
      kept.push_back(v.next);
      accepted += v.accepted;
      h.scheduler_.Resolve(s.seq, s.start + s.num_new - s.num_drafts, kept);
    }
    if (plan.copies.ticket > 0) h.started_.push_back({plan.copies.ticket, copy_delay});
    uint64_t done = 0;
    while (!h.started_.empty() && h.started_.front().second <= 0) {
      done = h.started_.front().first;
      h.started_.pop_front();
    }
    for (auto& [ticket, left] : h.started_) --left;
    if (done > 0) h.scheduler_.CopiesCompleted(done);
    h.pool_.CheckInvariants();
    h.swap_pool_.CheckInvariants();
    // Every computed position holds its sequence's token: on the device (each KV group's block that is still
    // held), or in swap space.
    for (const auto& [name, seq] : h.seqs_) {
      for (int32_t p = 0; p < seq->num_computed; ++p) {
        for (const std::vector<int32_t>& table : seq->block_tables) {
          if (p / bs < static_cast<int32_t>(table.size()) && table[p / bs] != kNoBlock) {
            ASSERT_EQ(kv[table[p / bs] * bs + p % bs], seq->tokens[p])
                << name << " position " << p << ", step " << step;
          }
        }
        for (const std::vector<int32_t>& table : seq->swapped_blocks) {
          if (p / bs < static_cast<int32_t>(table.size()) && table[p / bs] != kNoBlock) {
            ASSERT_EQ(host[table[p / bs] * bs + p % bs], seq->tokens[p]) << name << " swapped, position " << p;
          }
        }
      }
    }
    std::map<int32_t, int32_t> holders;
    for (const auto& [name, seq] : h.seqs_)
      for (int32_t b : Capacity::HeldBlocks(seq->block_tables)) holders[b]++;
    for (const auto& [b, n] : holders) ASSERT_EQ(h.pool_.RefCount(b), n) << "block " << b;
    ASSERT_EQ(static_cast<int32_t>(holders.size()) + h.pool_.num_free(), h.pool_.num_total());
    std::vector<char> done_names;
    for (const auto& [name, seq] : h.seqs_) {
      if (seq->num_tokens() >= target[name] && seq->num_computed == seq->num_tokens() - 1) done_names.push_back(name);
    }
    for (char name : done_names) {
      h.Finish(name);
      ++finished;
    }
  }
  EXPECT_GE(finished, 200);
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  EXPECT_GT(h.scheduler_.counters().preemptions, 0);
  if (limits.prefix_caching) {
    EXPECT_GT(h.scheduler_.counters().prefix_hit_tokens, 0);
  }
  for (auto it = h.seqs_.begin(); it != h.seqs_.end();) h.Finish((it++)->first);
  h.scheduler_.CopiesCompleted(h.scheduler_.copies_in_flight());
  EXPECT_EQ(h.pool_.num_free(), h.pool_.num_total());
  EXPECT_EQ(h.swap_pool_.num_free(), h.swap_pool_.num_total()) << "no host block leaked";
}

// Planned ahead (the previous step still running): a sequence decodes its pending token, the step input
// names it by the row that samples it, and a sequence whose pending token is its last allowed one waits.
TEST(Scheduler, PlannedAheadASequenceDecodesItsPendingTokenUntilItsLastAllowedOne) {
  SchedulerHarness h({.max_num_seqs = 4, .max_num_batched_tokens = 16, .block_size = 4, .long_prefill_chunk = 16}, 8);
  h.Add('A', 6);
  h.Add('B', 3);
  Sequence& a = *h.seqs_.at('A');
  Sequence& b = *h.seqs_.at('B');
  a.request.stopping.max_tokens = 2;
  const StepPlan first = h.scheduler_.Schedule(h.now_);
  ASSERT_EQ(SchedulerHarness::Describe(first), "A6+ B3+");
  h.scheduler_.Launched(first);
  EXPECT_EQ(a.tokens.back(), PendingToken(0));
  EXPECT_EQ(b.tokens.back(), PendingToken(1));

  const StepPlan second = h.scheduler_.Schedule(h.now_, /*ahead=*/true);
  ASSERT_EQ(SchedulerHarness::Describe(second), "A1+ B1+");
  EXPECT_FALSE(second.needs_sync);
  EXPECT_EQ(BuildStepInput(second, 4).token_ids, (std::vector<int32_t>{PendingToken(0), PendingToken(1)}));
  h.scheduler_.Launched(second);
  h.scheduler_.Resolve(&a, 6, 50);  // the first step's tokens reach the host
  h.scheduler_.Resolve(&b, 3, 51);
  EXPECT_EQ(a.num_output_tokens(), 2) << "one known, one pending";

  const StepPlan third = h.scheduler_.Schedule(h.now_, /*ahead=*/true);
  EXPECT_EQ(SchedulerHarness::Describe(third), "B1+") << "A's pending token is its last: A computes nothing more";
  EXPECT_EQ(BuildStepInput(third, 4).token_ids, (std::vector<int32_t>{PendingToken(1)}));
  h.scheduler_.Launched(third);
  h.scheduler_.Resolve(&a, 7, 52);
  h.scheduler_.Resolve(&b, 4, 53);
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{7, 7, 7, 7, 7, 7, 50, 52}));
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{7, 7, 7, 51, 53, PendingToken(0)}));
  h.pool_.CheckInvariants();
}

// Planned ahead, nobody is preempted: a sequence that would need it waits, and the plan asks for the next
// step to be planned with the results in, where the usual preemption happens.
TEST(Scheduler, PlannedAheadNobodyIsPreemptedTheNextPlanWaitsForTheResults) {
  SchedulerHarness h({.max_num_seqs = 2, .max_num_batched_tokens = 16, .block_size = 4}, 3);
  h.Add('A', 4);
  h.Add('B', 4, /*priority=*/1);
  Sequence& a = *h.seqs_.at('A');
  Sequence& b = *h.seqs_.at('B');
  const StepPlan first = h.scheduler_.Schedule(h.now_);
  ASSERT_EQ(SchedulerHarness::Describe(first), "B4+ A4+");
  h.scheduler_.Launched(first);
  // Both need a 2nd block and one is free: B takes it; A would preempt itself, so it waits.
  const StepPlan ahead = h.scheduler_.Schedule(h.now_, /*ahead=*/true);
  EXPECT_EQ(SchedulerHarness::Describe(ahead), "B1+");
  EXPECT_TRUE(ahead.preempted.empty());
  EXPECT_TRUE(ahead.needs_sync);
  h.scheduler_.Launched(ahead);
  h.scheduler_.Resolve(&b, 4, 100);
  h.scheduler_.Resolve(&a, 4, 100);
  h.scheduler_.Resolve(&b, 5, 100);
  const StepPlan after = h.scheduler_.Schedule(h.now_);
  EXPECT_EQ(PreemptedNames(after), "A");
  EXPECT_EQ(SchedulerHarness::Describe(after), "B1+");
  EXPECT_FALSE(after.needs_sync);
  h.pool_.CheckInvariants();
}

// A full block is remembered for prefix reuse under its tokens' ids: not while its last token is pending.
TEST(Scheduler, APrefixBlockIsRememberedOnceItsPendingTokenIsKnown) {
  SchedulerHarness h({.max_num_seqs = 4, .max_num_batched_tokens = 16, .block_size = 4, .prefix_caching = true}, 8);
  h.Add('A', 7);
  Sequence& a = *h.seqs_.at('A');
  const StepPlan first = h.scheduler_.Schedule(h.now_);
  h.scheduler_.Launched(first);
  EXPECT_EQ(a.block_keys.size(), 1u);
  const StepPlan second = h.scheduler_.Schedule(h.now_, /*ahead=*/true);
  ASSERT_EQ(SchedulerHarness::Describe(second), "A1+");
  h.scheduler_.Launched(second);  // block 1 is computed, but its last token is still pending
  EXPECT_EQ(a.block_keys.size(), 1u);
  h.scheduler_.Resolve(&a, 7, 7);
  EXPECT_EQ(a.block_keys.size(), 2u);
  h.Add('B', 9);  // the same 8 tokens, then one more: reuses both blocks
  const StepPlan third = h.scheduler_.Schedule(h.now_, /*ahead=*/true);
  EXPECT_EQ(SchedulerHarness::Describe(third), "A1+ B1+");
  EXPECT_EQ(h.seqs_.at('B')->num_cached_tokens, 8);
}

INSTANTIATE_TEST_SUITE_P(PrefixCachingAndSwap, RandomizedScheduler,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(false),
                                            ::testing::Values(0, 2), ::testing::Bool()));
INSTANTIATE_TEST_SUITE_P(HostTier, RandomizedScheduler,
                         ::testing::Combine(::testing::Values(true), ::testing::Bool(), ::testing::Values(true),
                                            ::testing::Values(0, 1, 3), ::testing::Bool()));

}  // namespace
}  // namespace inferd

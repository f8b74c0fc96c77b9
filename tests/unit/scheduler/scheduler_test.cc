#include "engine/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>

namespace inferd {
namespace {

// Sequences are named by one letter; the fake "model" samples token 100 for everyone.
class SchedulerHarness {
 public:
  SchedulerHarness(SchedulerLimits limits, int32_t num_blocks) : pool_(num_blocks), scheduler_(limits, &pool_) {}

  void Add(char name, int32_t prompt_len) {
    auto seq = std::make_unique<Sequence>();
    seq->request.id = std::string(1, name);
    seq->tokens.assign(prompt_len, 7);
    seq->num_prompt_tokens = prompt_len;
    scheduler_.Add(seq.get());
    seqs_[name] = std::move(seq);
  }

  StepPlan Step() {
    StepPlan plan = scheduler_.Schedule();
    std::vector<int32_t> sampled;
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.wants_token) sampled.push_back(100);
    }
    scheduler_.Update(plan, sampled);
    pool_.CheckInvariants();
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
  Scheduler scheduler_;
  std::map<char, std::unique_ptr<Sequence>> seqs_;
};

struct ExpectedStep {
  std::string scheduled;
  std::string preempted;
  std::string running;
  std::string waiting;
  int32_t free_blocks;
  char finish_after = 0;  // the test finishes this sequence after the step
};

TEST(Scheduler, StepTableWithChunkedPrefillPreemptionAndFinish) {
  // block_size 4, 6 blocks, at most 3 sequences and 8 tokens per step.
  SchedulerHarness h({.max_num_seqs = 3, .max_num_batched_tokens = 8, .block_size = 4}, 6);
  h.Add('A', 6);
  h.Add('B', 5);
  h.Add('C', 3);
  const std::vector<ExpectedStep> table = {
      {"A6+ B2", "", "AB", "C", 3},        // A prefills whole; B gets the last 2 tokens of budget
      {"A1+ B3+ C3+", "", "ABC", "", 1},   // B finishes its prefill; C is admitted
      {"A1+ B1+ C1+", "", "ABC", "", 1},   // all decode; every sequence still fits its blocks
      {"A1+ B1+", "C", "AB", "C", 1},      // C needs a 2nd block: none free, so C (most recent) is preempted
      {"A1+ B1+", "", "AB", "C", 1, 'A'},  // C (5 tokens, 2 blocks) cannot come back yet; then A finishes
      {"B1+ C5+", "", "BC", "", 1},        // A's 3 blocks are back: B grows, C recomputes prompt + output
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const ExpectedStep& e = table[i];
    const StepPlan plan = h.Step();
    std::string preempted;
    for (const Sequence* s : plan.preempted) preempted += s->request.id;
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(SchedulerHarness::Describe(plan), e.scheduled);
    EXPECT_EQ(preempted, e.preempted);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.running()), e.running);
    EXPECT_EQ(SchedulerHarness::Names(h.scheduler_.waiting()), e.waiting);
    EXPECT_EQ(h.pool_.num_free(), e.free_blocks);
    if (e.finish_after) h.Finish(e.finish_after);
  }
  EXPECT_EQ(h.seqs_.at('C')->num_preemptions, 1);
  EXPECT_EQ(h.seqs_.at('C')->num_tokens(), 6) << "3 prompt + 2 before preemption + 1 after";
  h.Finish('B');
  h.Finish('C');
  EXPECT_EQ(h.pool_.num_free(), 6) << "finished sequences return every block";
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

TEST(Scheduler, RandomizedArrivalsAndFinishesNeverLeakAndAlwaysProgress) {
  std::mt19937 rng(42);
  const SchedulerLimits limits{.max_num_seqs = 5, .max_num_batched_tokens = 24, .block_size = 4};
  SchedulerHarness h(limits, 20);
  std::map<char, int32_t> target;  // total length at which the test finishes the sequence
  char next = 'A';
  int finished = 0;
  for (int step = 0; step < 3000 && finished < 200; ++step) {
    if (h.seqs_.size() < 12 && rng() % 3 == 0) {
      const char name = static_cast<char>('A' + (next++ - 'A') % 52);
      if (!h.seqs_.count(name)) {
        const int32_t prompt = 1 + static_cast<int32_t>(rng() % 30);
        h.Add(name, prompt);
        target[name] = prompt + 1 + static_cast<int32_t>(rng() % 40);  // ≤ 71 tokens = 18 blocks ≤ pool
      }
    }
    const StepPlan plan = h.Step();
    ASSERT_LE(plan.num_tokens, limits.max_num_batched_tokens);
    ASSERT_LE(static_cast<int32_t>(plan.seqs.size()), limits.max_num_seqs);
    if (!h.seqs_.empty()) ASSERT_FALSE(plan.empty()) << "a non-empty scheduler always makes progress";
    int32_t held = 0;
    for (const auto& [name, seq] : h.seqs_) held += static_cast<int32_t>(seq->block_table.size());
    ASSERT_EQ(held + h.pool_.num_free(), h.pool_.num_total()) << "every block is held by one sequence or free";
    std::vector<char> done;
    for (const auto& [name, seq] : h.seqs_) {
      if (seq->num_tokens() >= target[name] && seq->num_computed == seq->num_tokens() - 1)
        done.push_back(name);
      else if (rng() % 200 == 0)
        done.push_back(name);  // aborts at random
    }
    for (char name : done) {
      h.Finish(name);
      ++finished;
    }
  }
  EXPECT_GE(finished, 200);
  for (auto it = h.seqs_.begin(); it != h.seqs_.end();) h.Finish((it++)->first);
  EXPECT_EQ(h.pool_.num_free(), h.pool_.num_total());
}

}  // namespace
}  // namespace inferd

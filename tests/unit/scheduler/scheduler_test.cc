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
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_NE(b.block_table[2], a.block_table[2]) << "the partly filled block is never shared";
  EXPECT_EQ(h.pool_.RefCount(a.block_table[0]), 2);
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

TEST(BlockPool, EvictsTheLeastRecentlyFreedCachedBlockFirstAndNeverAWrongOne) {
  BlockPool pool(3);
  const std::vector<int32_t> blocks = pool.Allocate(3);
  const std::vector<int32_t> t0 = {1, 2}, t1 = {3, 4}, t2 = {5, 6};
  const uint64_t k0 = BlockPool::BlockKey(0, t0), k1 = BlockPool::BlockKey(k0, t1), k2 = BlockPool::BlockKey(0, t2);
  pool.Remember(blocks[0], k0, t0);
  pool.Remember(blocks[1], k1, t1);
  pool.Remember(blocks[2], k2, t2);
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

class RandomizedScheduler : public ::testing::TestWithParam<bool> {};

TEST_P(RandomizedScheduler, ArrivalsAndFinishesNeverLeakAndAlwaysProgress) {
  std::mt19937 rng(42);
  const SchedulerLimits limits{
      .max_num_seqs = 5, .max_num_batched_tokens = 24, .block_size = 4, .prefix_caching = GetParam()};
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
    std::map<int32_t, int32_t> holders;  // block -> sequences holding it (shared prefix blocks: several)
    for (const auto& [name, seq] : h.seqs_)
      for (int32_t b : seq->block_table) holders[b]++;
    for (const auto& [b, n] : holders) ASSERT_EQ(h.pool_.RefCount(b), n) << "block " << b;
    ASSERT_EQ(static_cast<int32_t>(holders.size()) + h.pool_.num_free(), h.pool_.num_total())
        << "every block is held or free";
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

INSTANTIATE_TEST_SUITE_P(PrefixCaching, RandomizedScheduler, ::testing::Bool());

}  // namespace
}  // namespace inferd

// Sampling on the device against the host sampler: greedy identical, raw logprobs equal, distributions within
// 5 standard deviations over many draws, and the same uniform gives the same token alone and in a batch.
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "engine/runtime/philox.h"
#include "engine/runtime/sampler.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/random_sampling.h"

namespace inferd {
namespace {

using testing::Dev;

struct Rows {
  std::vector<float> logits;
  std::vector<kernels::SamplingRowParams> params;
  std::vector<int32_t> indptr = {0}, tokens, counts;
  std::vector<uint8_t> flags;
  std::vector<float> bias;        // per entry; zeros where not given
  std::vector<uint32_t> allowed;  // [rows, ⌈vocab / 32⌉] structured-output masks (rows whose params say masked)
};

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs, top_logprobs;
  std::vector<int32_t> top_ids;
};

// late_masks: the masks are not there when the kernel starts (the buffer holds zeros, the ready word 0); another
// stream copies them in and then sets the word, after the kernel has been waiting a while (a step planned ahead
// whose masks the host fills while its forward pass runs).
Result RunOnDevice(const Rows& r, int32_t vocab, bool late_masks = false) {
  const int32_t n = static_cast<int32_t>(r.params.size());
  Dev<float> logits(r.logits);
  Dev<kernels::SamplingRowParams> params(r.params);
  Dev<int32_t> indptr(r.indptr), tokens(r.tokens), counts(r.counts);
  Dev<uint8_t> flags(r.flags);
  std::vector<float> bias_host = r.bias;
  bias_host.resize(r.tokens.size() + 1, 0.f);
  Dev<float> bias(bias_host);
  Dev<float> raw(r.tokens.size() + 1);
  const std::vector<uint32_t> masks = r.allowed.empty() ? std::vector<uint32_t>(1) : r.allowed;
  Dev<uint32_t> allowed(late_masks ? std::vector<uint32_t>(masks.size(), 0u) : masks);
  Dev<uint32_t> ready(std::vector<uint32_t>{late_masks ? 0u : 1u});
  Dev<int32_t> out(n), top_ids(n * kernels::kMaxTopLogprobs);
  Dev<float> lp(n), top_lp(n * kernels::kMaxTopLogprobs);
  cudaStream_t sampling = nullptr, copies = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&sampling, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(kernels::SampleRows(logits.get(), n, vocab, params.get(), indptr.get(), tokens.get(), counts.get(),
                                flags.get(), bias.get(), raw.get(), allowed.get(), out.get(), lp.get(), top_ids.get(),
                                top_lp.get(), sampling, ready.get()),
            cudaSuccess);
  if (late_masks) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaStreamQuery(sampling), cudaErrorNotReady) << "the masked rows wait for their masks";
    const uint32_t one = 1;
    EXPECT_EQ(cudaMemcpyAsync(allowed.get(), masks.data(), masks.size() * 4, cudaMemcpyHostToDevice, copies),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(ready.get(), &one, 4, cudaMemcpyHostToDevice, copies), cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(sampling);
  cudaStreamDestroy(copies);
  return {out.Host(), lp.Host(), top_lp.Host(), top_ids.Host()};
}

kernels::SamplingRowParams Params(const SamplingParams& p, double u, int32_t top_logprobs = 0, int32_t target = -1) {
  return {p.temperature,       p.top_k,      p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
          p.frequency_penalty, top_logprobs, target,  u};
}

TEST(DeviceSampler, GreedyAndLogprobsEqualTheHostSampler) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(7);
  const int32_t vocab = 128257, rows = 5;  // odd, larger than one pass of the block
  Rows r;
  r.logits = testing::Random(int64_t{rows} * vocab, rng, 3.f);
  SamplingParams greedy;
  greedy.temperature = 0;
  for (int32_t i = 0; i < rows; ++i) {
    r.params.push_back(Params(greedy, 0.5, i + 1));
    r.indptr.push_back(0);
  }
  const Result got = RunOnDevice(r, vocab);
  for (int32_t i = 0; i < rows; ++i) {
    std::vector<float> row(r.logits.begin() + int64_t{i} * vocab, r.logits.begin() + int64_t{i + 1} * vocab);
    SamplingRow hr{.params = greedy, .top_logprobs = i + 1};
    const SampleResult want = Sample(row, hr);
    EXPECT_EQ(got.tokens[i], want.token) << "row " << i;
    EXPECT_NEAR(got.logprobs[i], want.logprob.logprob, 1e-3) << "row " << i;
    for (int32_t k = 0; k <= i; ++k) {
      EXPECT_EQ(got.top_ids[i * kernels::kMaxTopLogprobs + k], want.logprob.top[k].token_id);
      EXPECT_NEAR(got.top_logprobs[i * kernels::kMaxTopLogprobs + k], want.logprob.top[k].logprob, 1e-3);
    }
  }
}

// Structured output's masks: greedy rows and sampled rows (temperature, top-k, top-p) pick only allowed tokens
// (greedy ones the token the host sampler picks under the same mask); an unmasked row beside them is untouched.
TEST(DeviceSampler, MaskedRowsPickAllowedTokensAsTheHostSamplerDoes) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(21);
  const int32_t vocab = 50021, rows = 6, words = (vocab + 31) / 32;
  Rows r;
  r.logits = testing::Random(int64_t{rows} * vocab, rng, 3.f);
  r.allowed.assign(int64_t{rows} * words, 0u);
  std::vector<SamplingParams> ps(rows);
  for (int32_t i = 0; i < rows; ++i) {
    ps[i].temperature = i % 2 == 0 ? 0.f : 0.8f;
    if (i == 3) ps[i].top_k = 5;
    if (i == 5) ps[i].top_p = 0.9f;
    // Every 7th token allowed from a row-dependent offset (row 4: a single token; row 1: unmasked).
    for (int32_t t = i; t < vocab; t += i == 4 ? vocab : 7) r.allowed[int64_t{i} * words + t / 32] |= 1u << (t % 32);
    kernels::SamplingRowParams params = Params(ps[i], (i + 0.5) / rows);
    params.masked = i == 1 ? 0 : 1;
    r.params.push_back(params);
    r.indptr.push_back(0);
  }
  const Result got = RunOnDevice(r, vocab);
  const Result late = RunOnDevice(r, vocab, /*late_masks=*/true);
  EXPECT_EQ(late.tokens, got.tokens) << "masks that land while the kernel waits pick the same tokens";
  for (int32_t i = 0; i < rows; ++i) {
    std::vector<float> row(r.logits.begin() + int64_t{i} * vocab, r.logits.begin() + int64_t{i + 1} * vocab);
    SamplingRow hr{.params = ps[i], .uniform = (i + 0.5) / rows};
    if (i != 1) hr.allowed = std::span<const uint32_t>(r.allowed.data() + int64_t{i} * words, words);
    const SampleResult want = Sample(row, hr);
    if (ps[i].temperature == 0) {  // greedy: the same token
      EXPECT_EQ(got.tokens[i], want.token) << "row " << i;
    }
    if (i != 1) {
      EXPECT_EQ((got.tokens[i] - i) % 7, 0) << "row " << i << " picked a masked-out token";
      EXPECT_EQ((want.token - i) % 7, 0) << "row " << i << " (host) picked a masked-out token";
    }
  }
  EXPECT_EQ(got.tokens[4], 4) << "the only allowed token";
}

TEST(DeviceSampler, PromptRowsReportTheTargetsLogprobAndSampleNothing) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  const int32_t vocab = 50021, rows = 4;
  Rows r;
  r.logits = testing::Random(int64_t{rows} * vocab, rng, 3.f);
  // Sampling options and penalties that would change a sampled row's token must not touch a prompt row.
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 3;
  p.repetition_penalty = 1.5f;
  const std::vector<int32_t> targets = {0, 17, vocab - 1, 4242}, tops = {0, 1, 5, 20};
  for (int32_t i = 0; i < rows; ++i) {
    r.params.push_back(Params(p, 0.25, tops[i], targets[i]));
    r.indptr.push_back(0);
  }
  const Result got = RunOnDevice(r, vocab);
  for (int32_t i = 0; i < rows; ++i) {
    std::vector<float> row(r.logits.begin() + int64_t{i} * vocab, r.logits.begin() + int64_t{i + 1} * vocab);
    SamplingRow hr{.params = p, .top_logprobs = tops[i], .target = targets[i]};
    const SampleResult want = Sample(row, hr);
    EXPECT_EQ(got.tokens[i], targets[i]) << "row " << i;
    EXPECT_EQ(want.logprob.token_id, targets[i]);
    EXPECT_NEAR(got.logprobs[i], want.logprob.logprob, 1e-3) << "row " << i;
    ASSERT_EQ(static_cast<int32_t>(want.logprob.top.size()), tops[i]);
    for (int32_t k = 0; k < tops[i]; ++k) {
      EXPECT_EQ(got.top_ids[i * kernels::kMaxTopLogprobs + k], want.logprob.top[k].token_id);
      EXPECT_NEAR(got.top_logprobs[i * kernels::kMaxTopLogprobs + k], want.logprob.top[k].logprob, 1e-3);
    }
  }
}

TEST(DeviceSampler, PenaltiesAndBansMatchTheHostSampler) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const int32_t vocab = 6;
  Rows r;
  r.logits = {2.0f, 1.0f, 0.5f, 1.9f, -1.f, 0.f};
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0f;
  p.frequency_penalty = 0.1f;
  r.params.push_back(Params(p, 0.5));
  // token 0 in the prompt; token 3 twice in the output; token 1 banned.
  r.tokens = {0, 1, 3};
  r.counts = {0, 0, 2};
  r.flags = {kernels::kPenaltySeen, kernels::kPenaltyBanned, kernels::kPenaltySeen};
  r.indptr.push_back(3);
  const Result got = RunOnDevice(r, vocab);
  std::vector<float> row = r.logits;
  const std::vector<int32_t> history = {0, 3, 3}, banned = {1};
  SamplingRow hr{.params = p, .tokens = history, .num_prompt_tokens = 1, .banned = banned};
  EXPECT_EQ(got.tokens[0], Sample(row, hr).token);
  // 0: 2 / 4 = 0.5; 1: banned; 2: 0.5 untouched; 3: 1.9 / 4 - 2 * 0.1 = 0.275. Ties go to the lower id.
  EXPECT_EQ(got.tokens[0], 0);
}

TEST(DeviceSampler, LogitBiasMatchesTheHostSamplerAndLeavesTheLogprobsRaw) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const int32_t vocab = 7;
  Rows r;
  r.logits = {2.0f, 1.0f, 0.5f, 1.9f, -1.f, 0.f, 0.3f};
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, -3.f}, {4, 3.5f}, {6, 100.f}};
  // Row 0: ids 0 (prompt, biased -3), 4 (+3.5), 6 (+100, but banned). Row 1: the same bias, nothing banned.
  for (int row = 0; row < 2; ++row) {
    r.logits.insert(r.logits.end(), r.logits.begin(), r.logits.begin() + vocab);
    r.params.push_back(Params(p, 0.5, 3));
    const bool banned = row == 0;
    r.tokens.insert(r.tokens.end(), {0, 4, 6});
    r.counts.insert(r.counts.end(), {0, 0, 0});
    r.flags.insert(r.flags.end(), {uint8_t(kernels::kPenaltySeen | kernels::kPenaltyBias), kernels::kPenaltyBias,
                                   uint8_t(kernels::kPenaltyBias | (banned ? kernels::kPenaltyBanned : 0))});
    r.bias.insert(r.bias.end(), {-3.f, 3.5f, 100.f});
    r.indptr.push_back(r.indptr.back() + 3);
  }
  r.logits.resize(2 * vocab);
  const Result got = RunOnDevice(r, vocab);
  for (int row = 0; row < 2; ++row) {
    std::vector<float> logits(r.logits.begin() + row * vocab, r.logits.begin() + (row + 1) * vocab);
    const std::vector<int32_t> history = {0}, banned = row == 0 ? std::vector<int32_t>{6} : std::vector<int32_t>{};
    SamplingRow hr{.params = p, .tokens = history, .num_prompt_tokens = 1, .banned = banned, .top_logprobs = 3};
    const SampleResult want = Sample(logits, hr);
    EXPECT_EQ(got.tokens[row], want.token) << "row " << row;
    EXPECT_NEAR(got.logprobs[row], want.logprob.logprob, 1e-4) << "row " << row;
    EXPECT_EQ(got.top_ids[row * kernels::kMaxTopLogprobs], want.logprob.top[0].token_id);
  }
  // 0: 2 / 2 - 3 = -2; 4: -1 + 3.5 = 2.5 beats 3's 1.9; 6 is banned in row 0 and wins with 100.3 in row 1.
  EXPECT_EQ(got.tokens[0], 4);
  EXPECT_EQ(got.tokens[1], 6);
  // The reported logprob is the raw one: token 0 (logit 2.0) is still the top alternative.
  EXPECT_EQ(got.top_ids[0], 0);
}

TEST(DeviceSampler, DistributionsMatchAndDrawsDependOnlyOnTheUniform) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  const int32_t vocab = 16;
  std::vector<float> base(vocab);
  for (int32_t i = 0; i < vocab; ++i) base[i] = std::log(float(i + 1));  // p ∝ i + 1
  struct Case {
    SamplingParams p;
    const char* name;
  };
  std::vector<Case> cases(4);
  cases[0].name = "temperature 1";
  cases[1].name = "top_k 5, temperature 0.7";
  cases[1].p.top_k = 5;
  cases[1].p.temperature = 0.7f;
  cases[2].name = "top_p 0.6";
  cases[2].p.top_p = 0.6f;
  cases[3].name = "min_p 0.45";
  cases[3].p.min_p = 0.45f;  // off the exact boundary p = 0.5 p_max of token 7
  const int draws = 20000;
  for (const Case& c : cases) {
    Rows r;
    for (int d = 0; d < draws; ++d) {
      r.logits.insert(r.logits.end(), base.begin(), base.end());
      r.params.push_back(Params(c.p, SamplingUniform(99, d)));
      r.indptr.push_back(0);
    }
    const Result got = RunOnDevice(r, vocab);
    std::map<int32_t, int> dev, host;
    for (int d = 0; d < draws; ++d) {
      dev[got.tokens[d]]++;
      std::vector<float> row = base;
      host[Sample(row, SamplingRow{.params = c.p, .uniform = SamplingUniform(1234, d)}).token]++;
    }
    for (int32_t t = 0; t < vocab; ++t) {
      const double ph = host[t] / double(draws), pd = dev[t] / double(draws);
      const double sd = std::sqrt(std::max(ph, 1.0 / draws) * (1 - ph) / draws) * std::sqrt(2.0);
      EXPECT_NEAR(pd, ph, 5 * sd + 1e-3) << c.name << ", token " << t;
    }
  }
  // The same row alone and in a batch of others: the same token.
  SamplingParams p;
  p.temperature = 0.9f;
  Rows alone, batch;
  alone.logits = base;
  alone.params = {Params(p, 0.37)};
  alone.indptr = {0, 0};
  for (int i = 0; i < 9; ++i) {
    batch.logits.insert(batch.logits.end(), base.begin(), base.end());
    batch.params.push_back(Params(p, i == 4 ? 0.37 : 0.05 * i));
    batch.indptr.push_back(0);
  }
  EXPECT_EQ(RunOnDevice(alone, vocab).tokens[0], RunOnDevice(batch, vocab).tokens[4]);
}

TEST(DeviceSampler, NoValidParametersProduceNanOrAnImpossibleToken) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(2027);
  const int32_t vocab = 97, rows = 2000;
  Rows r;
  std::vector<int32_t> banned(rows);
  for (int32_t i = 0; i < rows; ++i) {
    r.params.push_back(Params(testing::RandomSamplingParams(rng, vocab), SamplingUniform(i, 3), 5));
    const std::vector<float> logits = testing::RandomLogits(rng, vocab);
    r.logits.insert(r.logits.end(), logits.begin(), logits.end());
    banned[i] = static_cast<int32_t>(rng() % vocab);
    for (int32_t t = 0; t < vocab; t += 3) {  // every third id seen, some in the output
      r.tokens.push_back(t);
      r.counts.push_back(t % 2);
      r.flags.push_back(kernels::kPenaltySeen | (t == banned[i] ? kernels::kPenaltyBanned : 0));
    }
    if (banned[i] % 3 != 0) {
      r.tokens.push_back(banned[i]);
      r.counts.push_back(0);
      r.flags.push_back(kernels::kPenaltyBanned);
    }
    r.indptr.push_back(static_cast<int32_t>(r.tokens.size()));
  }
  const Result got = RunOnDevice(r, vocab);
  for (int32_t i = 0; i < rows; ++i) {
    ASSERT_GE(got.tokens[i], 0) << "row " << i;
    ASSERT_LT(got.tokens[i], vocab) << "row " << i;
    ASSERT_NE(got.tokens[i], banned[i]) << "row " << i;
    ASSERT_TRUE(std::isfinite(got.logprobs[i]) && got.logprobs[i] <= 1e-6f) << "row " << i;
    for (int k = 0; k < 5; ++k) ASSERT_TRUE(std::isfinite(got.top_logprobs[i * kernels::kMaxTopLogprobs + k]));
  }
}

}  // namespace
}  // namespace inferd

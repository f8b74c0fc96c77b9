// engine.kv_cache_dtype on the cpu backend: K and V stored in 16 bits (float16 or bfloat16, rounded to nearest-even
// as they are written, widened exactly as attention reads them): the row kernels against the fp32 arithmetic of the
// rounded values on odd lengths; whole models' greedy runs against the float32 cache (the same fp32 weights) through
// the real engine — prompts prefilled in blocks (BlockedAttention) and in chunks beside decodes, which read the cache
// a row at a time — with tokens equal until a near-tie and chosen logprobs close; half the bytes a block.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/backends/cpu/stored_matmul.h"
#include "engine/backends/cpu/vec_ops.h"
#include "engine/engine.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/greedy_runs.h"

namespace inferd {
namespace {

using testing::CompareGreedy;
using testing::GreedyRun;

// A 16-bit format's relative rounding step: half a unit in the last place of its significand.
double HalfUlp(KvElement e) {
  return e == KvElement::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

class KvRows : public ::testing::TestWithParam<KvElement> {};

TEST_P(KvRows, RoundToNearestAndDotAndAxpyReadTheRoundedValues) {
  const KvElement e = GetParam();
  ASSERT_EQ(KvElementBytes(e), 2);
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.f, 3.f);
  for (const int64_t n : {1, 7, 8, 15, 16, 17, 64, 131, 256}) {
    std::vector<float> x(n), q(n), y(n), back(n);
    for (float& v : x) v = d(rng);
    for (float& v : q) v = d(rng);
    for (float& v : y) v = d(rng);
    std::vector<uint16_t> row(n);
    StoreKv(x.data(), row.data(), n, e);
    LoadKv(row.data(), back.data(), n, e);
    double dot = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_LE(std::abs(back[i] - x[i]), HalfUlp(e) * std::abs(x[i])) << KvElementName(e) << " n " << n << " i " << i;
      dot += double(q[i]) * back[i];
      scale += std::abs(double(q[i]) * back[i]);
    }
    EXPECT_NEAR(DotKv(q.data(), row.data(), n, e), dot, 1e-6 * scale + 1e-30) << KvElementName(e) << " n " << n;
    std::vector<float> z = y;
    AxpyKv(0.75f, row.data(), z.data(), n, e);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(z[i], y[i] + 0.75 * back[i], 1e-6 * (std::abs(y[i]) + std::abs(back[i])))
          << KvElementName(e) << " n " << n << " i " << i;
    }
  }
  // Values the format holds exactly come back unchanged.
  const std::vector<float> exact = {0.f, 1.f, -2.5f, 0.375f, 1024.f, -0.0078125f};
  std::vector<uint16_t> row(exact.size());
  std::vector<float> back(exact.size());
  StoreKv(exact.data(), row.data(), static_cast<int64_t>(exact.size()), e);
  LoadKv(row.data(), back.data(), static_cast<int64_t>(exact.size()), e);
  EXPECT_EQ(back, exact) << KvElementName(e);
}

INSTANTIATE_TEST_SUITE_P(Formats, KvRows, ::testing::Values(KvElement::kFloat16, KvElement::kBfloat16),
                         [](const auto& info) { return std::string(KvElementName(info.param)); });

GreedyRun Generate(const std::string& model, const std::string& kv_cache_dtype,
                   const std::vector<std::vector<int32_t>>& prompts) {
  Config config;
  config.model.path = model;
  config.engine.backend = "cpu";
  config.engine.kv_cache_dtype = kv_cache_dtype;
  config.engine.block_size = 3;  // pages end mid-prompt
  config.engine.cpu_kv_cache_gib = 0.05;
  config.engine.num_threads = 2;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_num_batched_tokens = 40;  // prompts of 16+ queries a step run in blocks, longer ones chunked
  return testing::RunGreedy(config, prompts, 12);
}

struct KvModelCase {
  const char* model;
  const char* kv_cache_dtype;
};

class KvCache16 : public ::testing::TestWithParam<KvModelCase> {};

// A 16-bit cache moves each score and output by about its rounding step: on the tiny random models (whose scores
// run large) a chosen token's logprob by under a hundredth with float16, and by up to 0.08 with bfloat16, whose
// step is 8 times float16's (llama3-tiny, 2026-11-28); tokens flip only where float32's top two are that close.
TEST_P(KvCache16, GreedyTokensAndLogprobsFollowTheFloat32Cache) {
  const KvModelCase& c = GetParam();
  const std::string path = testing::ModelDir(c.model);
  const auto prompts = testing::LcgPrompts(5, 29, 9, 11);  // 9 to 53 tokens
  const GreedyRun fp32 = Generate(path, "float32", prompts);
  const GreedyRun half = Generate(path, c.kv_cache_dtype, prompts);
  const bool bf16 = std::string(c.kv_cache_dtype) == "bfloat16";
  const double tolerance = bf16 ? 0.15 : 0.02;
  const int compared =
      CompareGreedy(fp32, half, tolerance, std::string(c.model) + " " + c.kv_cache_dtype, /*flip_margin=*/tolerance);
  EXPECT_GT(compared, 40) << "most positions are compared";
  EXPECT_EQ(fp32.plan.kv_dtype, "float32");
  EXPECT_EQ(half.plan.kv_dtype, c.kv_cache_dtype);
  EXPECT_EQ(half.plan.kv_bytes_per_block * 2, fp32.plan.kv_bytes_per_block) << "half the bytes a block";
}

INSTANTIATE_TEST_SUITE_P(Models, KvCache16,
                         ::testing::Values(KvModelCase{"llama3-tiny", "float16"},
                                           KvModelCase{"llama3-tiny", "bfloat16"},
                                           KvModelCase{"gemma3-tiny", "float16"},   // windows, 256-wide heads
                                           KvModelCase{"gemma2-tiny", "bfloat16"},  // soft-capped scores
                                           KvModelCase{"qwen3-tiny", "float16"}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.model) + "_" + info.param.kv_cache_dtype;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// auto follows engine.cpu_weights: float32 beside fp32 weights (the reference), float16 beside the stored ones;
// fp8_e4m3 is the cuda backend's, refused naming what the cpu backend allows.
TEST(KvCacheDtype, AutoFollowsTheWeightsAndFp8IsRefused) {
  Config config;
  config.model.path = testing::SourcePath("tests/fixtures/models/llama2-tiny.gguf");
  config.engine.backend = "cpu";
  config.engine.cpu_kv_cache_gib = 0.05;
  for (const char* weights : {"fp32", "as_stored"}) {
    if (std::string(weights) == "as_stored" && !StoredKernelsAvailable()) continue;
    config.engine.cpu_weights = weights;
    auto engine = Engine::Create(config);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->memory_plan().kv_dtype, std::string(weights) == "fp32" ? "float32" : "float16") << weights;
  }
  config.engine.kv_cache_dtype = "fp8_e4m3";
  auto engine = Engine::Create(config);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(engine.status().message().find("engine.kv_cache_dtype = 'fp8_e4m3'"), std::string::npos) << engine.status();
  EXPECT_NE(engine.status().message().find("allows: auto, float32, float16, bfloat16"), std::string::npos)
      << engine.status();
}

}  // namespace
}  // namespace inferd

// engine.tensor_parallel_size on the cpu backend: the model split over 2 and 4 shards on threads, with the sums
// after attention and the MLP taken in host memory, gives the unsharded run's greedy tokens and logprobs on every
// test model (4 query heads; 4, 2 or 1 KV heads, so that 4 shards replicate KV heads; the mixtures of experts split
// every expert's intermediate columns, the router whole on every shard), through the real engine
// with batching, chunked prefill and small blocks. This checks the splitting arithmetic of
// engine/model/tensor_parallel.h without a GPU.
#include "engine/model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/greedy_runs.h"

namespace inferd {
namespace {

using testing::CompareGreedy;
using testing::GreedyRun;
using testing::RunGreedy;

GreedyRun Generate(const std::string& model, int32_t tensor_parallel_size,
                   const std::vector<std::vector<int32_t>>& prompts) {
  Config config;
  config.model.path = model;
  config.engine.backend = "cpu";
  config.engine.block_size = 3;  // pages end mid-prompt
  config.engine.cpu_kv_cache_gib = 0.05;
  config.engine.num_threads = 2;
  config.engine.tensor_parallel_size = tensor_parallel_size;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_num_batched_tokens = 24;  // long prompts are prefilled in chunks beside decodes
  return RunGreedy(config, prompts, 12);
}

class TensorParallel : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorParallel, ShardsOnThreadsGiveTheUnshardedGreedyTokensAndLogprobs) {
  const std::string model = GetParam();
  const std::string path =
      model.ends_with(".gguf") ? testing::SourcePath("tests/fixtures/models/" + model) : testing::ModelDir(model);
  const auto prompts = testing::LcgPrompts(6, 7, 5, 9);
  const GreedyRun whole = Generate(path, 1, prompts);
  ASSERT_EQ(whole.tokens.size(), prompts.size());
  for (int32_t n : {2, 4}) {
    const GreedyRun split = Generate(path, n, prompts);
    EXPECT_GT(CompareGreedy(whole, split, 1e-4, model + " at " + std::to_string(n) + " shards"), 60)
        << "most tokens are compared, not skipped";
    // The KV pool holds each rank's KV heads: more bytes per block where 4 shards replicate 2 or 1 KV heads.
    EXPECT_GE(split.plan.kv_bytes_per_block, whole.plan.kv_bytes_per_block);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel,
                         ::testing::Values("llama2-tiny", "llama3-tiny", "mistral-tiny", "qwen2-tiny", "qwen3-tiny",
                                           "gemma2-tiny", "gemma3-tiny", "phi3-tiny", "llama2-tiny.gguf",
                                           "qwen2-tiny.gguf", "qwen3-tiny.gguf", "gemma3-tiny.gguf", "phi3-tiny.gguf",
                                           "llama3-tiny-fp8", "mixtral-tiny", "qwen3-moe-tiny", "mixtral-tiny.gguf",
                                           "qwen3-moe-tiny.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// A model the size does not split is refused at start-up, naming the key, the value and the sizes that split it.
TEST(TensorParallelConfig, ASizeThatDoesNotSplitTheModelIsRefusedNamingTheSizesThatDo) {
  ModelConfig c;
  c.num_heads = 12;
  c.num_kv_heads = 4;
  c.intermediate_size = 96;
  c.head_dim = 8;
  EXPECT_TRUE(CheckTensorParallel(c, 4).ok());
  const absl::Status s = CheckTensorParallel(c, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("engine.tensor_parallel_size = 8"), std::string::npos) << s;
  EXPECT_NE(s.message().find("allowed for this model: 1, 2, 4"), std::string::npos) << s;
  c.num_kv_heads = 3;  // 12 heads split by 4, but 3 KV heads neither divide by 4 nor 4 by 3
  EXPECT_FALSE(CheckTensorParallel(c, 4).ok());
}

// The shards cover every head, KV head and column once (KV heads: at least once), and each query head reads the KV
// head the unsharded model gives it.
TEST(TensorParallelConfig, VocabularyRunsCoverTheVocabularyInOrderEachStartingOnA64IdBoundary) {
  for (int32_t vocab : {1, 63, 64, 100, 1000, 32000, 128256, 151936}) {
    ModelConfig c;
    c.vocab_size = vocab;
    c.num_heads = c.num_kv_heads = 8;
    c.intermediate_size = 64;
    for (int32_t n : {1, 2, 4, 8}) {
      int64_t next = 0;
      for (int32_t r = 0; r < n; ++r) {
        const IndexRange v = ShardOf(c, n, r).vocab;
        SCOPED_TRACE(std::to_string(vocab) + " ids, rank " + std::to_string(r) + " of " + std::to_string(n));
        EXPECT_EQ(v.begin, next);
        EXPECT_GE(v.size(), 0);
        if (v.size() > 0) {  // an empty run lies at the end
          EXPECT_EQ(v.begin % 64, 0);
        }
        EXPECT_LE(v.size(), ShardOf(c, n, 0).vocab.size());  // rank 0's run is the longest
        next = v.end;
      }
      EXPECT_EQ(next, vocab);
    }
  }
}

TEST(TensorParallelConfig, ShardsCoverTheModelAndMapQueryHeadsToTheirKvHeads) {
  for (int32_t kv : {8, 4, 2, 1}) {
    ModelConfig c;
    c.num_heads = 8;
    c.num_kv_heads = kv;
    c.intermediate_size = 64;
    c.head_dim = 4;
    for (int32_t n : {1, 2, 4, 8}) {
      ASSERT_TRUE(CheckTensorParallel(c, n).ok()) << kv << " " << n;
      int64_t heads = 0, cols = 0;
      for (int32_t r = 0; r < n; ++r) {
        const TensorParallelShard s = ShardOf(c, n, r);
        EXPECT_EQ(s.q_heads.begin, heads);
        heads = s.q_heads.end;
        EXPECT_EQ(s.intermediate.begin, cols);
        cols = s.intermediate.end;
        for (int64_t h = 0; h < s.q_heads.size(); ++h) {
          const int64_t local = s.LocalKvHead(c, h);
          ASSERT_GE(local, 0);
          ASSERT_LT(local, s.kv_heads.size());
          EXPECT_EQ(s.kv_heads.begin + local, (s.q_heads.begin + h) / (c.num_heads / kv));
        }
        int64_t rows = 0;
        for (const IndexRange& run : s.QkvRows(c)) rows += run.size();
        EXPECT_EQ(rows, (s.q_heads.size() + 2 * s.kv_heads.size()) * c.head_dim);
      }
      EXPECT_EQ(heads, c.num_heads);
      EXPECT_EQ(cols, c.intermediate_size);
    }
  }
}

}  // namespace
}  // namespace inferd

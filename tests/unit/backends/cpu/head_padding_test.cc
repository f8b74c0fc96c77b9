// Heads padded with zeros for the attention kernels (engine/model/head_padding.h): padded tensors decode as the
// stored ones with zero rows or columns between heads, and the cpu backend, the reference, running a padded model
// gives the unpadded model's greedy tokens and logprobs (biases, partial rotary with LongRoPE, fused checkpoints,
// GGUF rotary order, fp8 checkpoints, split over 2 shards), so what the cuda backend runs padded is the same model.
#include "engine/model/head_padding.h"

#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "kernels/sizes.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/greedy_runs.h"

namespace inferd {
namespace {

using testing::CompareGreedy;
using testing::GreedyRun;
using testing::RunGreedy;

std::string PathOf(const std::string& model) {
  return model.ends_with(".gguf") ? testing::SourcePath("tests/fixtures/models/" + model) : testing::ModelDir(model);
}

// Greedy continuations with their logprobs; with pad_to > 0 the cpu backend runs the model padded to it.
GreedyRun Generate(const std::string& path, int32_t pad_to, int32_t tensor_parallel_size,
                   const std::vector<std::vector<int32_t>>& prompts) {
  Config config;
  config.model.path = path;
  config.engine.backend = "cpu";
  config.engine.block_size = 3;
  config.engine.cpu_kv_cache_gib = 0.05;
  config.engine.num_threads = 2;
  config.engine.tensor_parallel_size = tensor_parallel_size;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_num_batched_tokens = 24;
  std::unique_ptr<Model> padded;  // outlives the engine's backend
  return RunGreedy(config, prompts, 10, [&](const Config& c, const Model& model) {
    if (pad_to == 0) return CreateCpuBackend(model, c.engine);
    auto p = WithPaddedHeads(model, pad_to);
    if (!p.ok()) return absl::StatusOr<std::unique_ptr<Backend>>(p.status());
    padded = std::move(*p);
    return CreateCpuBackend(*padded, c.engine);
  });
}

class HeadPadding : public ::testing::TestWithParam<const char*> {};

TEST_P(HeadPadding, APaddedModelGivesTheUnpaddedGreedyTokensAndLogprobs) {
  const std::string path = PathOf(GetParam());
  auto model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const int32_t head_dim = (*model)->config.head_dim;
  const int32_t pad_to = head_dim + 16;  // as 96 runs at 128: a wider head, zeros after each
  const auto prompts = testing::LcgPrompts(5, 11, 4, 11);
  const GreedyRun plain = Generate(path, 0, 1, prompts);
  ASSERT_EQ(plain.tokens.size(), prompts.size());
  for (int32_t shards : {1, 2}) {
    const GreedyRun padded = Generate(path, pad_to, shards, prompts);
    EXPECT_GT(CompareGreedy(plain, padded, 1e-4, "padded on " + std::to_string(shards) + " shards"), 40)
        << "most tokens are compared, not skipped";
    if (shards == 1) {  // the KV cache holds the padded heads
      EXPECT_EQ(padded.plan.kv_bytes_per_block * head_dim, plain.plan.kv_bytes_per_block * pad_to);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HeadPadding,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "phi3-tiny", "phi3-tiny.gguf",
                                           "llama2-tiny.gguf", "llama3-tiny-fp8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// Padded tensors read as their stored rows and columns, each head followed by zeros, whichever rows are read.
TEST(HeadPaddingTensors, RowsAndColumnsOfEachHeadAreTheStoredOnesThenZeros) {
  auto model = LoadModel(testing::ModelDir("qwen2-tiny"));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config;
  const int32_t D = c.head_dim, P = D + 8;
  auto padded = WithPaddedHeads(**model, P);
  ASSERT_TRUE(padded.ok()) << padded.status();
  const LayerTensors& s = (*model)->tensors.layers[1];
  const LayerTensors& p = (*padded)->tensors.layers[1];
  EXPECT_EQ((*padded)->config.head_dim, P);
  EXPECT_EQ((*padded)->config.rotary_dim, D) << "the rotary embedding turns the stored dimensions";
  EXPECT_DOUBLE_EQ((*padded)->config.attention_scale, 1.0 / std::sqrt(double(D))) << "the scale of the stored head";
  // Rows: q_proj, read from an odd first row.
  ASSERT_EQ(p.q_proj.rows, int64_t{c.num_heads} * P);
  std::vector<float> stored(s.q_proj.numel()), rows(5 * p.q_proj.cols);
  ASSERT_TRUE(DecodeRows(s.q_proj, 0, s.q_proj.rows, stored.data()).ok());
  const int64_t first = P - 3;  // the last pad rows of head 0, then head 1's first stored rows
  const absl::Status read = DecodeRows(p.q_proj, first, 5, rows.data());
  ASSERT_TRUE(read.ok()) << read;
  for (int64_t r = first; r < first + 5; ++r) {
    const int64_t head = r / P, within = r % P;
    for (int64_t col = 0; col < p.q_proj.cols; ++col) {
      const float want = within < D ? stored[(head * D + within) * s.q_proj.cols + col] : 0.f;
      ASSERT_EQ(rows[(r - first) * p.q_proj.cols + col], want) << r << " " << col;
    }
  }
  // Columns: o_proj, and the q bias (a vector).
  for (auto [st, pt] : {std::pair{&s.o_proj, &p.o_proj}, std::pair{&s.q_bias, &p.q_bias}}) {
    ASSERT_EQ(pt->cols, st->cols / D * P) << pt->name;
    std::vector<float> a(st->numel()), b(pt->numel());
    ASSERT_TRUE(DecodeRows(*st, 0, st->rows, a.data()).ok());
    ASSERT_TRUE(DecodeRows(*pt, 0, pt->rows, b.data()).ok());
    for (int64_t r = 0; r < pt->rows; ++r) {
      for (int64_t col = 0; col < pt->cols; ++col) {
        const int64_t head = col / P, within = col % P;
        const float want = within < D ? a[r * st->cols + head * D + within] : 0.f;
        ASSERT_EQ(b[r * pt->cols + col], want) << pt->name << " " << r << " " << col;
      }
    }
  }
  EXPECT_FALSE(RowsOf(p.q_proj, 0, 1, "part").ok()) << "a padded tensor is not cut further";
}

// Which head dims run padded, and to what; a family whose per-head norms would see the padding is refused.
TEST(HeadPaddingTensors, OnlyHeadDimsTheKernelsLackArePaddedAndPerHeadNormsAreRefused) {
  EXPECT_EQ(kernels::AttentionRunHeadDim(64), 64);
  EXPECT_EQ(kernels::AttentionRunHeadDim(96), 128);
  EXPECT_EQ(kernels::AttentionRunHeadDim(80), 128);
  EXPECT_EQ(kernels::AttentionRunHeadDim(32), 64);
  EXPECT_EQ(kernels::AttentionRunHeadDim(160), 256);
  EXPECT_EQ(kernels::AttentionRunHeadDim(256), 256);
  EXPECT_EQ(kernels::AttentionRunHeadDim(288), 0);
  EXPECT_EQ(kernels::AttentionRunHeadDim(95), 0);
  auto qwen3 = LoadModel(testing::ModelDir("qwen3-tiny"));
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  const auto refused = WithPaddedHeads(**qwen3, (*qwen3)->config.head_dim * 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("per-head q/k norms"), std::string::npos) << refused.status();
  auto llama = LoadModel(testing::ModelDir("llama3-tiny"));
  ASSERT_TRUE(llama.ok());
  EXPECT_FALSE(WithPaddedHeads(**llama, (*llama)->config.head_dim).ok()) << "padding widens";
  auto as_run = PaddedForAttentionKernels(**llama);
  ASSERT_TRUE(as_run.ok()) << as_run.status();
  ASSERT_NE(*as_run, nullptr) << "the tiny model's head dim is below 64";
  EXPECT_EQ((*as_run)->config.head_dim, kernels::AttentionRunHeadDim((*llama)->config.head_dim));
}

}  // namespace
}  // namespace inferd

// The cuda backend through the real engine against Hugging Face transformers, on random-weight models with the
// head dims the backend serves (made on the GPU machine by scripts/gpu_run.sh: tools/make_test_models.py
// --gpu-models, tools/make_reference_fixtures.py in fp32 on the CPU and in bf16 on the GPU). Greedy tokens must
// agree up to the first position whose reference top-2 margin is under 0.1; all prompts run batched, the long
// one over many blocks and in prefill chunks. Skips without a GPU or without INFERD_GPU_MODELS.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

struct CudaCase {
  const char* model;
  const char* reference_suffix;  // "" = fp32 on the CPU, "-bf16" = bf16 on the GPU
  int32_t block_size;
  int32_t max_num_batched_tokens;
  const char* dtype = "auto";  // engine.dtype
  bool cuda_graphs = true;     // engine.cuda_graphs: decode steps replay captured graphs
};

class CudaParity : public ::testing::TestWithParam<CudaCase> {};

TEST_P(CudaParity, GreedyTokensMatchTransformersUntilANearTie) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const CudaCase& c = GetParam();
  const std::string model_dir = std::string(dir) + "/" + c.model;
  const std::string ref_path = std::string(dir) + "/reference/" + c.model + c.reference_suffix + ".json";
  if (!std::filesystem::exists(ref_path)) GTEST_SKIP() << ref_path << " is missing";
  const nlohmann::json ref = testing::ReadJson(ref_path);
  Config config;
  config.model.path = model_dir;
  config.engine.backend = "cuda";
  config.engine.block_size = c.block_size;
  config.engine.dtype = c.dtype;
  config.engine.cuda_graphs = c.cuda_graphs;
  config.engine.gpu_memory_utilization = 0.3;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_num_batched_tokens = c.max_num_batched_tokens;
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_EQ((*engine)->backend_name(), "cuda");

  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    Request r;
    r.id = "case-" + std::to_string(i);
    r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    r.sampling.temperature = 0;
    r.stopping.max_tokens = static_cast<int32_t>(ref["cases"][i]["steps"].size());
    r.stopping.ignore_eos = true;
    r.top_logprobs = 5;
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks.back();
    ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  int compared = 0, total = 0;
  double worst_logprob_error = 0;
  std::string first_mismatch;
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitFor(absl::Seconds(120)));
    ASSERT_EQ(sinks[i]->finish, FinishReason::kLength) << sinks[i]->error;
    const auto& steps = ref["cases"][i]["steps"];
    ASSERT_EQ(sinks[i]->tokens.size(), steps.size());
    for (size_t s = 0; s < steps.size(); ++s) {
      ++total;
      const double margin = steps[s]["margin"].get<double>();
      if (margin < 0.1) break;  // a near-tie may flip; what follows may differ
      const double err = std::abs(sinks[i]->logprobs[s].logprob - steps[s]["top"][0][1].get<double>());
      if (sinks[i]->tokens[s] != steps[s]["token"].get<int32_t>()) {
        if (first_mismatch.empty()) {
          first_mismatch = absl::StrCat("case ", i, " step ", s, ": got ", sinks[i]->tokens[s], ", want ",
                                        steps[s]["token"].get<int32_t>(), " (reference margin ", margin, ")");
        }
        break;
      }
      worst_logprob_error = std::max(worst_logprob_error, err);
      ++compared;
    }
  }
  EXPECT_TRUE(first_mismatch.empty()) << c.model << c.reference_suffix << ": " << first_mismatch;
  std::printf("[ parity   ] %s%s %s block %d budget %d: %d of %d positions compared, worst chosen-logprob error %.4f\n",
              c.model, c.reference_suffix, c.dtype, c.block_size, c.max_num_batched_tokens, compared, total,
              worst_logprob_error);
  EXPECT_GT(compared, total / 4) << "most positions are compared, not skipped";
  EXPECT_LT(worst_logprob_error, 0.25) << "bf16 logprobs stay near the reference";
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back once all requests finished";
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaParity,
    ::testing::Values(CudaCase{"llama3-hd64", "", 16, 2048}, CudaCase{"llama3-hd64", "-bf16", 16, 2048},
                      CudaCase{"qwen2-hd128", "", 16, 2048}, CudaCase{"qwen2-hd128", "-bf16", 16, 2048},
                      CudaCase{"mistral-hd128-g3", "", 16, 2048}, CudaCase{"mistral-hd128-g3", "-bf16", 16, 2048},
                      CudaCase{"llama3-hd64", "-bf16", 1, 13}, CudaCase{"qwen2-hd128", "-bf16", 3, 24},
                      CudaCase{"mistral-hd128-g3", "", 16, 2048, "float16"},
                      CudaCase{"llama3-hd64", "", 16, 2048, "float16"},
                      CudaCase{"qwen2-hd128", "-bf16", 16, 2048, "auto", false}),
    [](const auto& info) {
      std::string n = info.param.model;
      for (char& ch : n)
        if (ch == '-') ch = '_';
      return n + (info.param.reference_suffix[0] ? "_bf16ref" : "_fp32ref") + "_bs" +
             std::to_string(info.param.block_size) + "_budget" + std::to_string(info.param.max_num_batched_tokens) +
             "_" + info.param.dtype + (info.param.cuda_graphs ? "" : "_eager");
    });

// Decodes `n` greedy requests of like-length random prompts, `steps` tokens each, top-2 logprobs kept.
std::vector<std::shared_ptr<testing::CollectingSink>> DecodeMany(const std::string& model_dir, bool cuda_graphs,
                                                                 int32_t n, int32_t steps,
                                                                 const std::string& plan_ahead = "auto") {
  Config config;
  config.model.path = model_dir;
  config.engine.backend = "cuda";
  config.engine.cuda_graphs = cuda_graphs;
  config.engine.plan_ahead = plan_ahead;
  config.engine.gpu_memory_utilization = 0.3;
  config.scheduler.max_num_seqs = 96;
  config.scheduler.max_num_batched_tokens = 4096;
  auto engine = Engine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::mt19937 rng(5);
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  for (int32_t i = 0; i < n; ++i) {
    Request r;
    r.id = "many-" + std::to_string(i);
    for (uint32_t t = 0, len = 24 + rng() % 8; t < len; ++t) r.prompt.push_back(static_cast<int32_t>(10 + rng() % 500));
    r.sampling.temperature = 0;
    r.stopping.max_tokens = steps - static_cast<int32_t>(i % 5);  // requests end in different steps
    r.stopping.ignore_eos = true;
    r.top_logprobs = 2;
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks.back();
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  for (auto& sink : sinks) EXPECT_TRUE(sink->WaitFor(absl::Seconds(120)));
  return sinks;
}

// Compares two runs of DecodeMany request by request up to each one's first near-tie (a top-2 margin under
// 0.05, which rounding may flip); returns the number of positions compared.
int SameTokensUntilANearTie(const std::vector<std::shared_ptr<testing::CollectingSink>>& a,
                            const std::vector<std::shared_ptr<testing::CollectingSink>>& b) {
  EXPECT_EQ(a.size(), b.size());
  int compared = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_TRUE(a[i]->error.ok() && b[i]->error.ok()) << a[i]->error << b[i]->error;
    EXPECT_EQ(a[i]->tokens.size(), b[i]->tokens.size()) << "request " << i;
    EXPECT_EQ(a[i]->usage.completion_tokens, static_cast<int32_t>(a[i]->tokens.size())) << "request " << i;
    for (size_t s = 0; s < std::min(a[i]->tokens.size(), b[i]->tokens.size()); ++s) {
      const auto& top = b[i]->logprobs[s].top;
      if (top.size() < 2 || top[0].logprob - top[1].logprob < 0.05) break;
      EXPECT_EQ(a[i]->tokens[s], b[i]->tokens[s]) << "request " << i << " step " << s;
      ++compared;
    }
  }
  return compared;
}

// 80 rows of 2 KV heads fill 132 SMs with like-length contexts: their decode steps replay the bucket's graph with
// unsplit KV attention, which must pick the tokens the kernels launched one by one pick (FlashInfer's own split).
TEST(CudaBackend, DecodeGraphsWithUnsplitKvAttentionPickTheTokensOfEagerSteps) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const std::string model_dir = std::string(dir) + "/qwen2-hd128";  // 2 KV heads
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int32_t n = 80;
  if (n * 2 < sms) GTEST_SKIP() << n << " rows of 2 KV heads do not fill " << sms << " SMs";
  const auto graphs = DecodeMany(model_dir, true, n, 12);
  const auto eager = DecodeMany(model_dir, false, n, 12);
  EXPECT_GT(SameTokensUntilANearTie(graphs, eager), n * 10 / 2) << "most positions are compared, not skipped";
}

// Planned ahead, each decode step reads the tokens the step before it sampled on the device (the embedding
// takes PendingToken rows from the sampled outputs), in graphs and in steps launched kernel by kernel, while
// requests end in different steps: the tokens are those of steps planned one after another.
TEST(CudaBackend, StepsPlannedAheadPickTheTokensOfStepsPlannedOneByOne) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const std::string model_dir = std::string(dir) + "/llama3-hd64";
  for (bool graphs : {true, false}) {
    const auto ahead = DecodeMany(model_dir, graphs, 40, 16, "on");
    const auto one_by_one = DecodeMany(model_dir, graphs, 40, 16, "off");
    EXPECT_GT(SameTokensUntilANearTie(ahead, one_by_one), 40 * 14 / 2) << (graphs ? "graphs" : "eager");
  }
}

TEST(CudaBackend, AModelWithAnUnsupportedHeadDimIsRefusedForCudaAndServedByAuto) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  Config config;
  config.model.path = testing::ModelDir("llama3-tiny");  // head_dim 16
  config.engine.backend = "cuda";
  config.engine.cpu_kv_cache_gib = 0.01;
  auto refused = Engine::Create(config);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("head_dim = 16"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("64, 128, 256"), std::string::npos) << refused.status();
  config.engine.backend = "auto";
  auto served = Engine::Create(config);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ((*served)->backend_name(), "cpu");
}

}  // namespace
}  // namespace inferd

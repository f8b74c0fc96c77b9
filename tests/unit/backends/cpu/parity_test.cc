// The cpu backend through the real engine (continuous batching, paged KV, chunked prefill) against
// greedy tokens and logprobs recorded with Hugging Face transformers (tools/make_reference_fixtures.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include "engine/engine.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"

namespace inferd {
namespace {

using testing::CollectingSink;

struct ParityCase {
  const char* model;  // names the reference fixture
  int32_t block_size;
  int32_t max_num_batched_tokens;
  const char* file = nullptr;  // the model to serve, relative to the source tree; default: its HF directory
  // Prefix caching on, every prompt served twice: the second time from the blocks the first left cached (a model
  // with sliding windows: the window groups' blocks behind each hit too).
  bool twice = false;
};

class Parity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(Parity, GreedyTokensAndLogprobsMatchTransformers) {
  const ParityCase& pc = GetParam();
  const nlohmann::json ref =
      testing::ReadJson(testing::SourcePath(std::string("tests/fixtures/reference/") + pc.model + ".json"));
  Config config;
  config.model.path = pc.file ? testing::SourcePath(pc.file) : testing::ModelDir(pc.model);
  config.engine.backend = "cpu";
  config.engine.block_size = pc.block_size;
  config.engine.cpu_kv_cache_gib = 0.05;
  config.scheduler.max_num_seqs = 8;
  config.scheduler.max_num_batched_tokens = pc.max_num_batched_tokens;
  config.scheduler.prefix_caching = pc.twice;
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();

  int compared = 0;
  for (int round = 0; round < (pc.twice ? 2 : 1); ++round) {
    // Every prompt at once: they are batched together, the long one prefilled in chunks.
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (size_t i = 0; i < ref["cases"].size(); ++i) {
      Request r;
      r.id = "case-" + std::to_string(i);
      r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
      const std::string command = ref["command"].get<std::string>();
      if (command.find("--gguf") != std::string::npos) {
        // The reference tokenized the text (chat turn included, or after the BOS of a base model's file) with
        // transformers' tokenizer from the same file.
        const bool special = command.find("(add_special_tokens)") != std::string::npos;
        EXPECT_EQ((*engine)->model().tokenizer->Encode(ref["cases"][i]["text"].get<std::string>(), special), r.prompt)
            << "case " << i;
      }
      r.sampling.temperature = 0;
      r.stopping.max_tokens = static_cast<int32_t>(ref["cases"][i]["steps"].size());
      r.stopping.ignore_eos = true;
      r.top_logprobs = 5;
      sinks.push_back(std::make_shared<CollectingSink>());
      r.sink = sinks.back();
      ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
    }
    for (size_t i = 0; i < sinks.size(); ++i) {
      sinks[i]->Wait();
      const auto& steps = ref["cases"][i]["steps"];
      ASSERT_EQ(sinks[i]->finish, FinishReason::kLength);
      ASSERT_EQ(sinks[i]->tokens.size(), steps.size());
      for (size_t s = 0; s < steps.size(); ++s) {
        const int32_t want = steps[s]["token"].get<int32_t>();
        const double margin = steps[s]["margin"].get<double>();
        const int32_t got = sinks[i]->tokens[s];
        if (got != want) {
          // Only a near-tie in the reference may flip; after a flip the sequences differ legitimately.
          ASSERT_LT(margin, 1e-2) << pc.model << " case " << i << " step " << s << ": got " << got << ", want " << want;
          break;
        }
        const TokenLogprob& lp = sinks[i]->logprobs[s];
        ASSERT_EQ(lp.top.size(), 5u);
        for (size_t k = 0; k < 5; ++k) {
          const auto& ref_top = steps[s]["top"][k];
          const double ref_lp = ref_top[1].get<double>();
          // Near-equal alternatives may swap order; compare the value at each rank.
          EXPECT_NEAR(lp.top[k].logprob, ref_lp, 2e-3 + 1e-4 * std::abs(ref_lp))
              << pc.model << " case " << i << " step " << s << " rank " << k;
        }
        EXPECT_NEAR(lp.logprob, steps[s]["top"][0][1].get<double>(), 2e-3) << "case " << i << " step " << s;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 100) << "most positions are compared, not skipped";
  const EngineStats stats = (*engine)->Stats();
  if (pc.twice) {
    EXPECT_GT(stats.prefix_hit_tokens, 0) << "the second round reused the first's blocks";
  }
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back once all requests finished";
}

INSTANTIATE_TEST_SUITE_P(
    Models, Parity,
    ::testing::Values(
        ParityCase{"llama2-tiny", 16, 2048}, ParityCase{"llama3-tiny", 16, 2048}, ParityCase{"mistral-tiny", 16, 2048},
        ParityCase{"qwen2-tiny", 16, 2048}, ParityCase{"qwen3-tiny", 16, 2048}, ParityCase{"qwen3-tiny", 3, 13},
        ParityCase{"gemma3-tiny", 16, 2048}, ParityCase{"gemma3-tiny", 3, 13},
        ParityCase{"gemma3-tiny", 4, 24, nullptr, /*twice=*/true},
        // Gemma 2: soft caps on the attention scores and the logits, window and global layers alternating
        ParityCase{"gemma2-tiny", 16, 2048}, ParityCase{"gemma2-tiny", 3, 13}, ParityCase{"phi3-tiny", 16, 2048},
        ParityCase{"phi3-tiny", 3, 13}, ParityCase{"mixtral-tiny", 16, 2048}, ParityCase{"mixtral-tiny", 3, 13},
        ParityCase{"qwen3-moe-tiny", 16, 2048}, ParityCase{"qwen3-moe-tiny", 3, 13}, ParityCase{"llama3-tiny", 3, 13},
        ParityCase{"qwen2-tiny", 1, 8}, ParityCase{"llama2-tiny", 16, 2048, "tests/fixtures/models/llama2-tiny.gguf"},
        ParityCase{"qwen2-tiny", 16, 2048, "tests/fixtures/models/qwen2-tiny.gguf"},
        ParityCase{"qwen3-tiny", 16, 2048, "tests/fixtures/models/qwen3-tiny.gguf"},
        ParityCase{"gemma3-tiny", 16, 2048, "tests/fixtures/models/gemma3-tiny.gguf"},
        ParityCase{"phi3-tiny", 16, 2048, "tests/fixtures/models/phi3-tiny.gguf"},
        ParityCase{"mixtral-tiny", 16, 2048, "tests/fixtures/models/mixtral-tiny.gguf"},
        ParityCase{"qwen3-moe-tiny", 16, 2048, "tests/fixtures/models/qwen3-moe-tiny.gguf"},
        ParityCase{"smollm2-135m-instruct", 16, 2048, "models/SmolLM2-135M-Instruct.Q4_1.gguf"},
        // Google's Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0), fetched by scripts/setup.sh.
        ParityCase{"gemma3-270m", 16, 2048, "models/gemma-3-270m-q4_k_m.gguf"}),
    [](const auto& info) {
      std::string n = info.param.model;
      std::replace(n.begin(), n.end(), '-', '_');
      if (info.param.file) n += "_gguf";
      if (info.param.twice) n += "_twice";
      return n + "_bs" + std::to_string(info.param.block_size) + "_budget" +
             std::to_string(info.param.max_num_batched_tokens);
    });

// engine.quantization = fp8 is the cuda backend's: the cpu backend refuses it at start-up, naming the key and
// what it allows, whether asked for directly or reached through engine.backend = auto.
TEST(CpuBackend, RefusesFp8QuantizationNamingTheKey) {
  for (const char* backend : {"cpu", "auto"}) {
    Config config;
    config.model.path = testing::ModelDir("llama3-tiny");
    config.engine.backend = backend;
    config.engine.quantization = "fp8";
    config.engine.cpu_kv_cache_gib = 0.05;
    auto engine = Engine::Create(config);
    if (engine.ok() && (*engine)->backend_name() == "cuda") continue;  // auto chose a GPU: fp8 is served there
    ASSERT_FALSE(engine.ok()) << backend;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(engine.status().message().find("engine.quantization = 'fp8'"), std::string::npos) << engine.status();
    EXPECT_NE(engine.status().message().find("allows: none"), std::string::npos) << engine.status();
  }
}

}  // namespace
}  // namespace inferd

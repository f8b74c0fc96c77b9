// The cuda backend through the real engine against Hugging Face transformers, on random-weight models with the
// head dims the backend serves (made on the GPU machine by scripts/gpu_run.sh: tools/make_test_models.py
// --gpu-models, tools/make_reference_fixtures.py in fp32 on the CPU and in bf16 on the GPU). Greedy tokens must
// agree up to the first position whose reference top-2 margin is under 0.1; all prompts run batched, the long
// one over many blocks and in prefill chunks. Skips without a GPU or without INFERD_GPU_MODELS.
// engine.quantization = fp8 runs are compared with the "-fp8a8" references: transformers in fp32 on the CPU with
// each linear weight replaced by its fp8 dequantization (the engine's per-channel scales, bit for bit) and each
// linear input rounded per token to e4m3, as the engine rounds them. What differs is the engine's bf16 arithmetic
// before each rounding, which moves an input across an e4m3 rounding boundary now and then (one e4m3 step is 12%
// of a value): positions are compared up to a near-tie of margin 0.5, not 0.1.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runtime/device_layout.h"
#include "tests/unit/collecting_sink.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/greedy_runs.h"

namespace inferd {
namespace {

struct CudaCase {
  const char* model;
  const char* reference_suffix;  // "" = fp32 on the CPU, "-bf16" = bf16 on the GPU
  int32_t block_size;
  int32_t max_num_batched_tokens;
  const char* dtype = "auto";           // engine.dtype
  bool cuda_graphs = true;              // engine.cuda_graphs: decode steps replay captured graphs
  int32_t max_num_seqs = 8;             // 1: every request alone (decode rows through the streaming products)
  int32_t copies = 1;                   // each prompt submitted this many times at once (a crowd)
  const char* quantization = "none";    // engine.quantization
  double near_tie = 0.1;                // positions are compared up to the reference's first top-2 margin under this
  double logprob_tolerance = 0.25;      // the chosen tokens' logprobs against the reference's
  const char* kv_cache_dtype = "auto";  // engine.kv_cache_dtype
  double near_tie_split = 0;            // where set, near_tie at tensor_parallel_size > 1
  double logprob_tolerance_split = 0;   // where set, logprob_tolerance at tensor_parallel_size > 1
};

// How far greedy tokens follow a reference: per prompt, the positions before the reference's first near-tie
// (top-2 margin under near_tie) are compared, and agree up to the first mismatch.
struct Agreement {
  int agreed = 0, compared = 0;
  std::string first_mismatch;
};

Agreement Agree(const std::vector<std::vector<int32_t>>& tokens, const nlohmann::json& ref, double near_tie = 0.1) {
  Agreement a;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& steps = ref["cases"][i % ref["cases"].size()]["steps"];
    size_t tie = 0;
    while (tie < steps.size() && steps[tie]["margin"].get<double>() >= near_tie) ++tie;
    a.compared += static_cast<int>(tie);
    for (size_t s = 0; s < tie && s < tokens[i].size(); ++s) {
      if (tokens[i][s] != steps[s]["token"].get<int32_t>()) {
        if (a.first_mismatch.empty()) {
          a.first_mismatch =
              absl::StrCat("prompt ", i, " step ", s, ": got ", tokens[i][s], ", want ",
                           steps[s]["token"].get<int32_t>(), " (margin ", steps[s]["margin"].get<double>(), ")");
        }
        break;
      }
      ++a.agreed;
    }
  }
  return a;
}

// A cuda engine's config for a parity run.
Config CudaConfig(const std::string& model_dir, const char* dtype, int32_t block_size, int32_t budget,
                  int32_t max_num_seqs, bool cuda_graphs, const char* quantization = "none",
                  const char* kv_cache_dtype = "auto") {
  Config config;
  config.engine.quantization = quantization;
  config.engine.kv_cache_dtype = kv_cache_dtype;
  config.model.path = model_dir;
  config.engine.backend = "cuda";
  config.engine.block_size = block_size;
  config.engine.dtype = dtype;
  config.engine.cuda_graphs = cuda_graphs;
  config.engine.gpu_memory_utilization = 0.3;
  config.scheduler.max_num_seqs = max_num_seqs;
  config.scheduler.max_num_batched_tokens = budget;
  config.scheduler.max_queue = 4096;
  // scripts/gpu_run.sh tp runs this suite split over GPUs too.
  if (const char* tp = std::getenv("INFERD_TENSOR_PARALLEL")) config.engine.tensor_parallel_size = std::atoi(tp);
  return config;
}

// The reference a case compares against: fp8 activations at tensor_parallel_size N against the one that quantizes
// as N ranks do (each its own slice of the o and down products' inputs: tools/make_reference_fixtures.py
// --fp8-activation-shards).
int TensorParallelSize() {
  const char* tp = std::getenv("INFERD_TENSOR_PARALLEL");
  return tp ? std::atoi(tp) : 1;
}
double NearTie(const CudaCase& c) {
  return TensorParallelSize() > 1 && c.near_tie_split > 0 ? c.near_tie_split : c.near_tie;
}
double LogprobTolerance(const CudaCase& c) {
  return TensorParallelSize() > 1 && c.logprob_tolerance_split > 0 ? c.logprob_tolerance_split : c.logprob_tolerance;
}
std::string ReferenceSuffix(const CudaCase& c) {
  std::string suffix = c.reference_suffix;
  if (suffix == "-fp8a8" && TensorParallelSize() > 1) suffix += absl::StrCat("-tp", TensorParallelSize());
  return suffix;
}

class CudaParity : public ::testing::TestWithParam<CudaCase> {};

// Greedy tokens equal the reference's up to its first near-tie (models of moderate activations; the "-sharp" ones
// are compared position by position below).
TEST_P(CudaParity, GreedyTokensMatchTransformersUntilANearTie) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const CudaCase& c = GetParam();
  const std::string model_dir = std::string(dir) + "/" + c.model;
  const std::string ref_path = std::string(dir) + "/reference/" + c.model + ReferenceSuffix(c) + ".json";
  if (!std::filesystem::exists(ref_path))
    FAIL() << ref_path << " is missing"
           << ": a parity run with nothing to compare fails (tools/make_reference_fixtures.py writes it)";
  const nlohmann::json ref = testing::ReadJson(ref_path);
  auto engine = Engine::Create(CudaConfig(model_dir, c.dtype, c.block_size, c.max_num_batched_tokens, c.max_num_seqs,
                                          c.cuda_graphs, c.quantization, c.kv_cache_dtype));
  if (!engine.ok() && absl::StrContains(engine.status().message(), "does not split this model")) {
    GTEST_SKIP() << engine.status().message();
  }
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_EQ((*engine)->backend_name(), "cuda");

  const size_t num_prompts = ref["cases"].size();
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  for (size_t i = 0; i < num_prompts * c.copies; ++i) {
    const auto& ref_case = ref["cases"][i % num_prompts];
    Request r;
    r.id = "case-" + std::to_string(i);
    r.prompt = ref_case["prompt_ids"].get<std::vector<int32_t>>();
    r.sampling.temperature = 0;
    r.stopping.max_tokens = static_cast<int32_t>(ref_case["steps"].size());
    r.stopping.ignore_eos = true;
    r.top_logprobs = 5;
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks.back();
    ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  std::vector<std::vector<int32_t>> tokens;
  double worst_logprob_error = 0;
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitFor(absl::Seconds(300)));
    ASSERT_EQ(sinks[i]->finish, FinishReason::kLength) << sinks[i]->error;
    const auto& steps = ref["cases"][i % num_prompts]["steps"];
    ASSERT_EQ(sinks[i]->tokens.size(), steps.size());
    tokens.push_back(sinks[i]->tokens);
    for (size_t s = 0; s < steps.size() && steps[s]["margin"].get<double>() >= NearTie(c); ++s) {
      if (sinks[i]->tokens[s] != steps[s]["token"].get<int32_t>()) break;
      worst_logprob_error =
          std::max(worst_logprob_error, std::abs(sinks[i]->logprobs[s].logprob - steps[s]["top"][0][1].get<double>()));
    }
  }
  const Agreement got = Agree(tokens, ref, NearTie(c));
  std::printf(
      "[ parity   ] %s%s %s%s%s block %d budget %d seqs %d x%d%s: %d of %d positions agree, worst chosen-logprob "
      "error %.4f\n",
      c.model, ReferenceSuffix(c).c_str(), c.dtype, std::string(c.quantization) == "none" ? "" : " fp8",
      std::string(c.kv_cache_dtype) == "auto" ? "" : " kv-fp8", c.block_size, c.max_num_batched_tokens, c.max_num_seqs,
      c.copies, c.cuda_graphs ? "" : " eager", got.agreed, got.compared, worst_logprob_error);
  EXPECT_TRUE(got.first_mismatch.empty()) << c.model << c.reference_suffix << ": " << got.first_mismatch;
  EXPECT_LT(worst_logprob_error, LogprobTolerance(c)) << "logprobs stay near the reference";
  if (NearTie(c) <= 0.1) {
    EXPECT_GT(got.compared, static_cast<int>(tokens.size()) * 32 / 4) << "most positions are compared, not skipped";
  } else {
    EXPECT_GE(got.compared, static_cast<int>(tokens.size()) * 2) << "positions are compared, not skipped";
  }
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back once all requests finished";
}

std::vector<CudaCase> AllCases() {
  return {{"llama3-hd64", "", 16, 2048},
          {"llama3-hd64", "-bf16", 16, 2048},
          {"qwen2-hd128", "", 16, 2048},
          {"qwen2-hd128", "-bf16", 16, 2048},
          {"mistral-hd128-g3", "", 16, 2048},
          {"mistral-hd128-g3", "-bf16", 16, 2048},
          // The families beyond Llama's layer (engine/model/arch/): per-head q/k norms; sandwich norms, GeGLU,
          // sliding windows shorter than the prompts and scaled embeddings; partial rotary with LongRoPE.
          {"qwen3-hd128", "", 16, 2048},
          {"qwen3-hd128", "-bf16", 16, 2048},
          {"qwen3-hd128", "-bf16", 1, 13},
          // one request at a time: every decode step one row (the streaming q/k/v product, then the per-head norms
          // with RoPE and the K/V write)
          {"qwen3-hd128", "", 16, 2048, "auto", true, 1},
          {"qwen3-hd128", "-bf16", 16, 2048, "auto", true, 1},
          // gemma3-hd256 against fp32 from a margin of 0.25: transformers' own bf16 run moves its chosen logprobs
          // by up to 0.12; inferd's agrees everywhere on one GPU and flipped at a margin of 0.126 split over two.
          {"gemma3-hd256", "", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          // Against transformers' bf16 run, gemma3-hd256 from a margin of 0.25: that run picks another token than
          // fp32 at a margin of 0.125 where inferd's bf16 agrees with fp32 (at every compared position, above).
          {"gemma3-hd256", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"gemma3-hd256", "-bf16", 3, 24, "auto", true, 8, 1, "none", 0.25},
          // Gemma 2: soft-capped scores and logits, window and global layers alternating; in crowds (FlashInfer's
          // soft-cap variants) and one request at a time (the decode kernel in the global layers).
          {"gemma2-hd256", "", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"gemma2-hd256", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"gemma2-hd256", "", 16, 2048, "auto", true, 1, 1, "none", 0.25},
          // phi3-hd128 in bf16 is compared from a margin of 0.25: transformers' own bf16 run misses 1 of 152
          // positions at 0.1 and moves chosen logprobs by up to 0.14 (measured on the CPU, teacher-forced along the
          // fp32 tokens), and inferd's bf16 first differed at margins 0.100 and 0.125 (fp16 agrees everywhere).
          {"phi3-hd128", "", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"phi3-hd128", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"phi3-hd128", "", 16, 2048, "float16"},
          // Phi-3-mini's heads of 96, run padded to 128 (head_padding.h): bf16, fp16, small pages, fp8 weights and
          // an fp8 KV cache (which the padded head dim allows).
          {"phi3-hd96", "", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"phi3-hd96", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.25},
          {"phi3-hd96", "-bf16", 3, 24, "auto", true, 8, 1, "none", 0.25},
          {"phi3-hd96", "", 16, 2048, "float16"},
          // fp8 weights and inputs move its chosen logprobs by up to 0.52 and flipped a token of margin 0.54; an
          // fp8 KV cache by up to 0.31 (one H100, 2026-11-26): compared from a margin of 0.75 and 0.5.
          {"phi3-hd96", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 0.75, 0.75},
          {"phi3-hd96", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.5, 0.5, "fp8_e4m3"},
          // fp8 moves qwen3-hd128's chosen logprobs by up to 0.26 and gemma3-hd256's by up to 0.32 on one GPU
          // (measured), as it moves qwen2-hd128's (below) by more. Split over ranks, each rank quantizes its own
          // slice of the o and down products' inputs: against the whole-row reference they moved by up to 0.37
          // and 0.46 at TP 2 and gemma3-hd256 flipped a token of margin 0.84, hence the per-slice references at
          // TP > 1 (ReferenceSuffix). Against those, gemma3-hd256's chosen logprobs move by 0.22 at most but a
          // token of margin 0.72 flips (two H100s, 2026-11-26): its fp8 logits move by up to ~0.37 (the largest
          // chosen-logprob error measured at TP 1 or 2), so a margin under twice that is a tie for it when split.
          // So it is for qwen3-hd128: over four ranks a token of margin 0.74 flipped (worst chosen-logprob error
          // 0.28; four H200s, 2026-11-26).
          {"qwen3-hd128", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 0.5, 0.5, "auto", 0.75},
          {"gemma3-hd256", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 0.5, 0.5, "auto", 0.75},
          // Mixtures of experts (kernels/moe_routing.h, moe_products.h) in fp16, run free against fp32: Mixtral's
          // layer and Qwen3-MoE's (128 experts, top 8, a dense layer among them); alone (decode rows one at a time),
          // in a crowd on small pages and budgets (prefill chunks of many rows per expert). In bf16 a rounding moves
          // a router logit across the top k's edge now and then, for transformers' own bf16 run as for inferd's,
          // and a run that follows its own tokens parts there: bf16 is compared teacher-forced (SharpParity), and
          // so is Qwen3-MoE's model in fp16 (its greedy runs meet near-ties early).
          {"mixtral-hd128", "", 16, 2048, "float16"},
          {"mixtral-hd128", "", 16, 2048, "float16", true, 1},
          {"mixtral-hd128", "", 3, 24, "float16", true, 8, 4},
          // Decode steps of up to 32 rows replayed from graphs: 64 slots over 8 experts, past 4 a run, through
          // CUTLASS's grouped GEMM on Hopper (the short-run schedule) inside the graph.
          {"mixtral-hd128", "", 16, 2048, "float16", true, 32, 4},
          {"llama3-hd64", "-bf16", 1, 13},
          {"qwen2-hd128", "-bf16", 3, 24},
          {"mistral-hd128-g3", "", 16, 2048, "float16"},
          {"llama3-hd64", "", 16, 2048, "float16"},
          {"qwen2-hd128", "-bf16", 16, 2048, "auto", false},
          {"qwen2-hd128", "-bf16", 16, 2048, "auto", true, 32, 4},
          {"qwen2-hd128", "-bf16", 16, 2048, "auto", true, 1},
          // fp8 against the -fp8a8 references: prefill through cuBLASLt's fp8 kernels (inputs quantized per
          // token), decode steps of 5 rows (batched) and of one (one request at a time) through the fp8 streaming
          // kernel (tensor-core tiles, CUDA cores) with bf16 inputs, which the reference rounds to e4m3: a little
          // apart by design.
          // qwen2-hd128 moves most: its chosen logprobs by up to 0.55 where the others move by 0.09, and one token
          // of margin 0.5-1 flips (measured). Our reading, not yet shown: its random QKV biases are large, so a q·k
          // logit carries bias · (the input's error), which an input rounded by the engine (from bf16) and by the
          // reference (from fp32) to neighbouring e4m3 values makes large; its bf16 run is also the furthest from
          // fp32 (0.11 against 0.05). Hence its near-tie margin of 1.0 and logprob tolerance of 0.75. Split over
          // four ranks it moved by up to 0.79 and flipped a token of margin 1.06 on 3-token pages (four H200s,
          // 2026-11-26; every other model agreed at every compared position there): 1.25 and 1.0 when split.
          {"llama3-hd64", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 0.5, 0.25},
          {"qwen2-hd128", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 1.0, 0.75, "auto", 1.25, 1.0},
          {"mistral-hd128-g3", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 0.5, 0.25},
          {"qwen2-hd128", "-fp8a8", 3, 24, "auto", true, 8, 1, "fp8", 1.0, 0.75, "auto", 1.25, 1.0},
          {"mistral-hd128-g3", "-fp8a8", 16, 2048, "float16", true, 8, 1, "fp8", 0.5, 0.25},
          {"llama3-hd64", "-fp8a8", 16, 2048, "auto", true, 1, 1, "fp8", 0.5, 0.25},
          {"mistral-hd128-g3", "-fp8a8", 16, 2048, "auto", true, 1, 1, "fp8", 0.5, 0.25},
          // An fp8 KV cache against references that keep K and V in full precision: each K and V value is rounded
          // to e4m3 (a relative step of up to 6 %), so positions are compared up to a near-tie of margin 0.5 as
          // for fp8 weights. Batched, on small pages, one request at a time (decode graphs), and with fp8 weights
          // and inputs too (all of FP8) against the -fp8a8 references.
          {"qwen2-hd128", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.5, 0.25, "fp8_e4m3"},
          {"mistral-hd128-g3", "-bf16", 16, 2048, "auto", true, 8, 1, "none", 0.5, 0.25, "fp8_e4m3"},
          {"qwen2-hd128", "-bf16", 3, 24, "auto", true, 8, 1, "none", 0.5, 0.25, "fp8_e4m3"},
          {"mistral-hd128-g3", "-bf16", 16, 2048, "auto", true, 1, 1, "none", 0.5, 0.25, "fp8_e4m3"},
          {"mistral-hd128-g3", "-fp8a8", 16, 2048, "auto", true, 8, 1, "fp8", 0.5, 0.25, "fp8_e4m3"}};
}

INSTANTIATE_TEST_SUITE_P(Models, CudaParity, ::testing::ValuesIn(AllCases()), [](const auto& info) {
  std::string n = info.param.model;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  const std::string suffix = info.param.reference_suffix;
  return n + (suffix.empty() ? "_fp32ref" : "_" + suffix.substr(1) + "ref") + "_bs" +
         std::to_string(info.param.block_size) + "_budget" + std::to_string(info.param.max_num_batched_tokens) + "_" +
         info.param.dtype + (info.param.cuda_graphs ? "" : "_eager") + "_seqs" +
         std::to_string(info.param.max_num_seqs) + "x" + std::to_string(info.param.copies) +
         (std::string(info.param.kv_cache_dtype) == "auto" ? "" : "_kvfp8");
});

// The host KV pool on cuda (copies on their own stream): a prompt whose device blocks were evicted comes back
// from the prefix cache's host tier and answers as it did when computed (the restored KV is bit for bit the
// computed one; the attention over it runs in another split); and a crowd on a tiny pool with swap space answers
// as each request did alone. No block is left held in either pool.
TEST(CudaBackend, HostTierRestoresAndSwapsOnTheCopyStreamGiveTheComputedAnswers) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  Config config = CudaConfig(std::string(dir) + "/qwen2-hd128", "auto", 16, 2048, 8, true);
  config.engine.num_blocks = 64;  // 1,024 tokens (the model's context is 512)
  config.engine.host_kv_cache_gib = 0.25;
  config.engine.swap_space_gib = 0.25;
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 rng(5);
  const auto prompt = [&](int32_t n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = 3 + static_cast<int32_t>(rng() % 500);
    return p;
  };
  const auto run = [&](std::vector<std::vector<int32_t>> prompts, int32_t max_tokens) {
    std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.id = "r" + std::to_string(i) + "-" + std::to_string(rng());
      r.prompt = prompts[i];
      r.sampling.temperature = 0;
      r.stopping.max_tokens = max_tokens;
      r.stopping.ignore_eos = true;
      r.top_logprobs = 2;
      sinks.push_back(std::make_shared<testing::CollectingSink>());
      r.sink = sinks.back();
      EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
    }
    for (auto& sink : sinks) {
      EXPECT_TRUE(sink->WaitFor(absl::Seconds(120)));
      EXPECT_EQ(sink->finish, FinishReason::kLength) << sink->error;
    }
    return sinks;
  };
  // Batch composition alone moves bf16 logprobs by a few hundredths (other product shapes, another attention
  // split): tokens equal up to the first near-tie of either run (margin 0.25), chosen logprobs within 0.1.
  const auto expect_same = [](const testing::CollectingSink& a, const testing::CollectingSink& b, const char* what) {
    ASSERT_EQ(a.tokens.size(), b.tokens.size());
    const auto margin = [](const TokenLogprob& lp) {
      return lp.top.size() > 1 ? lp.top[0].logprob - lp.top[1].logprob : 1e9f;
    };
    for (size_t s = 0; s < a.tokens.size(); ++s) {
      if (std::min(margin(a.logprobs[s]), margin(b.logprobs[s])) < 0.25) return;
      EXPECT_EQ(a.tokens[s], b.tokens[s]) << what << " step " << s;
      if (a.tokens[s] != b.tokens[s]) return;
      EXPECT_NEAR(a.logprobs[s].logprob, b.logprobs[s].logprob, 0.1) << what << " step " << s;
    }
  };
  const std::vector<int32_t> p = prompt(400);
  const auto first = run({p}, 24);
  for (int i = 0; i < 4; ++i) run({prompt(400)}, 8);  // evicts p's blocks from the device
  const EngineStats before = (*engine)->Stats();
  EXPECT_GT(before.copied_to_host_bytes, 0) << "evicted prefix blocks were written back";
  const auto again = run({p}, 24);
  const EngineStats after = (*engine)->Stats();
  EXPECT_GE(after.host_hit_tokens - before.host_hit_tokens, 320) << "20 of p's 25 full blocks came back";
  expect_same(*first[0], *again[0], "restored from the host tier");
  // A crowd: 12 requests of 14-20 blocks each on 64 blocks preempt one another into swap space.
  std::vector<std::vector<int32_t>> crowd;
  for (int i = 0; i < 12; ++i) crowd.push_back(prompt(150 + 10 * i));
  std::vector<std::shared_ptr<testing::CollectingSink>> solo;
  for (const auto& c : crowd) solo.push_back(run({c}, 64)[0]);
  const int64_t swapped = (*engine)->Stats().swapped_preemptions;
  const auto together = run(crowd, 64);
  EXPECT_GT((*engine)->Stats().swapped_preemptions, swapped) << "the crowd swapped";
  for (size_t i = 0; i < crowd.size(); ++i) expect_same(*solo[i], *together[i], "with swaps");
  const EngineStats end = (*engine)->Stats();
  EXPECT_EQ(end.free_blocks, end.total_blocks);
  EXPECT_EQ(end.host_swap_blocks, 0);
  std::printf(
      "[ parity   ] host tier on cuda: %lld tokens restored, %lld swapped preemptions, %.1f MiB to the host, "
      "%.1f MiB back\n",
      static_cast<long long>(after.host_hit_tokens - before.host_hit_tokens),
      static_cast<long long>(end.swapped_preemptions), end.copied_to_host_bytes / 1048576.0,
      end.copied_to_device_bytes / 1048576.0);
}

// engine.kv_cache_dtype = fp8_e4m3 takes half the bytes a block: the same budget holds about twice the blocks (the
// weights and activations are the same). It needs bf16 activations and head_dim 128 or 256; anything else is
// refused at start-up naming the key and the value.
TEST(CudaBackend, AnFp8KvCacheHoldsTwiceTheBlocksAndIsRefusedWhereItCannotRun) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const std::string hd128 = std::string(dir) + "/qwen2-hd128", hd64 = std::string(dir) + "/llama3-hd64";
  int64_t blocks[2] = {};
  for (int kv8 = 0; kv8 < 2; ++kv8) {
    auto engine = Engine::Create(CudaConfig(hd128, "auto", 16, 2048, 8, true, "none", kv8 ? "fp8_e4m3" : "auto"));
    ASSERT_TRUE(engine.ok()) << engine.status();
    blocks[kv8] = (*engine)->Stats().total_blocks;
    EXPECT_EQ((*engine)->memory_plan().kv_bytes_per_block * (kv8 ? 2 : 1),
              PlanDeviceLayout((*engine)->model(), {8, 2048, 16}, 2).kv_bytes_per_block);
  }
  EXPECT_NEAR(static_cast<double>(blocks[1]) / blocks[0], 2.0, 0.02) << blocks[0] << " and " << blocks[1];
  for (const auto& [model, dtype, wanted] :
       {std::tuple{hd64, "auto", "head_dim 128 or 256"}, std::tuple{hd128, "float16", "engine.dtype bfloat16"}}) {
    auto engine = Engine::Create(CudaConfig(model, dtype, 16, 2048, 8, true, "none", "fp8_e4m3"));
    ASSERT_FALSE(engine.ok()) << model << " " << dtype;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(engine.status().message().find("engine.kv_cache_dtype = 'fp8_e4m3'"), std::string::npos)
        << engine.status();
    EXPECT_NE(engine.status().message().find(wanted), std::string::npos) << engine.status();
  }
}

// How RunReferencePrompts hands its prompts to the engine: all at once (the running engine batches them as they
// arrive, so its step shapes depend on timing), or each after the one before has finished (every run makes the
// same steps: a prompt's prefill, then one-row decodes).
enum class Arrival { kTogether, kOneAtATime };

// Submits the reference's prompts to an engine made from `config` (greedy, as many tokens as the reference has,
// the chosen token's logprob) and waits for every answer, into *sinks.
void RunReferencePrompts(const Config& config, const nlohmann::json& ref,
                         std::vector<std::shared_ptr<testing::CollectingSink>>* sinks,
                         Arrival arrival = Arrival::kTogether) {
  auto engine = Engine::Create(config);
  ASSERT_TRUE(engine.ok()) << config.model.path << ": " << engine.status();
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    Request r;
    r.id = "case-" + std::to_string(i);
    r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    r.sampling.temperature = 0;
    r.stopping.max_tokens = static_cast<int32_t>(ref["cases"][i]["steps"].size());
    r.stopping.ignore_eos = true;
    r.top_logprobs = 1;
    sinks->push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks->back();
    ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
    if (arrival == Arrival::kOneAtATime) {
      ASSERT_TRUE(sinks->back()->WaitFor(absl::Seconds(300)));
    }
  }
  for (auto& sink : *sinks) {
    ASSERT_TRUE(sink->WaitFor(absl::Seconds(300)));
    ASSERT_EQ(sink->finish, FinishReason::kLength) << sink->error;
  }
}

// Two runs of the reference's prompts give the same tokens up to the reference's first margin under 0.1, with
// chosen logprobs within 0.02. Returns the positions compared.
int ExpectSameRuns(const nlohmann::json& ref, const std::vector<std::shared_ptr<testing::CollectingSink>>& a,
                   const std::vector<std::shared_ptr<testing::CollectingSink>>& b, const std::string& what) {
  int compared = 0;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    const auto& steps = ref["cases"][i]["steps"];
    for (size_t s = 0; s < steps.size() && steps[s]["margin"].get<double>() >= 0.1; ++s, ++compared) {
      if (a[i]->tokens[s] != b[i]->tokens[s]) {
        ADD_FAILURE() << what << " prompt " << i << " step " << s << ": " << a[i]->tokens[s] << " against "
                      << b[i]->tokens[s];
        break;
      }
      EXPECT_NEAR(a[i]->logprobs[s].logprob, b[i]->logprobs[s].logprob, 0.02)
          << what << " prompt " << i << " step " << s;
    }
  }
  return compared;
}

// An FP8 checkpoint of a model (tools/make_fp8_checkpoint.py, per channel: bit for bit the weights that
// `engine.quantization: fp8` makes at load) runs as stored on cuda and answers as the online quantization of the
// original does: the same greedy tokens up to the reference's first near-tie (margin 0.1), chosen logprobs within
// 0.02 (the two engines may pick different cuBLASLt algorithms by timing). One prompt at a time: prompts arriving
// together at a running engine are batched by timing, and steps of other sizes take other product paths (the
// weight-streaming kernels, the grouped GEMMs), whose last-bit differences the random mixtures' near-tied routers
// turn into other experts. scripts/gpu_run.sh writes the checkpoints under $INFERD_GPU_MODELS-fp8.
TEST(Fp8CheckpointOnCuda, AnswersAsOnlineQuantizationOfTheOriginal) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  // The mixtures' experts too (compressed-tensors as llm-compressor writes a Mixtral or Qwen3-MoE checkpoint: every
  // expert's products F8_E4M3 per channel, the routers in 16 bits).
  for (const char* model : {"llama3-hd64", "qwen2-hd128", "mixtral-hd128", "qwen3-moe-hd128"}) {
    const std::string original = std::string(dir) + "/" + model, checkpoint = std::string(dir) + "-fp8/" + model;
    const std::string ref_path = std::string(dir) + "/reference/" + model + "-fp8a8.json";
    if (!std::filesystem::exists(checkpoint) || !std::filesystem::exists(ref_path)) {
      FAIL() << checkpoint << " or " << ref_path << " is missing"
             << ": a parity run with nothing to compare fails";
    }
    const nlohmann::json ref = testing::ReadJson(ref_path);
    std::vector<std::vector<std::shared_ptr<testing::CollectingSink>>> runs;
    for (const auto& [path, quantization] : {std::pair{original, "fp8"}, std::pair{checkpoint, "none"}}) {
      ASSERT_NO_FATAL_FAILURE(RunReferencePrompts(CudaConfig(path, "auto", 16, 2048, 8, true, quantization), ref,
                                                  &runs.emplace_back(), Arrival::kOneAtATime));
    }
    const int compared = ExpectSameRuns(ref, runs[0], runs[1], model);
    std::printf("[ parity   ] %s FP8 checkpoint against online fp8: %d positions equal\n", model, compared);
    EXPECT_GT(compared, 20) << model;
  }
}

// An fp8 KV cache with the checkpoint's scales (kv_cache_scheme; here K 2 and V 4, so the cache holds K / 2 and
// V / 4: nothing new saturates, values under 2^-6 times the scale become subnormal) is as close to the reference as
// the cache without scales (the CudaParity kv-fp8 cases: tokens up to a near-tie of margin 0.5, chosen logprobs
// within 0.25 of the -fp8a8 reference), and close to the unscaled run. A scale applied on one side only (the
// write, attention's sm_scale or its output) moves logits 2-4x.
TEST(Fp8CheckpointOnCuda, AnFp8KvCacheAppliesTheCheckpointsKvScales) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const std::string plain = std::string(dir) + "/mistral-hd128-g3";
  const std::string scaled = std::string(dir) + "-fp8/mistral-hd128-g3-kvscales";
  const std::string ref_path = std::string(dir) + "/reference/mistral-hd128-g3-fp8a8.json";
  if (!std::filesystem::exists(scaled) || !std::filesystem::exists(ref_path)) {
    FAIL() << scaled << " or " << ref_path << " is missing"
           << ": a parity run with nothing to compare fails";
  }
  const nlohmann::json ref = testing::ReadJson(ref_path);
  auto model = LoadModel(scaled);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->tensors.kv_cache_scales);
  EXPECT_EQ((*model)->tensors.layers[0].k_cache_scale, 2.f);
  EXPECT_EQ((*model)->tensors.layers[0].v_cache_scale, 4.f);
  std::vector<std::vector<std::shared_ptr<testing::CollectingSink>>> runs;
  for (const auto& [path, quantization] : {std::pair{plain, "fp8"}, std::pair{scaled, "none"}}) {
    ASSERT_NO_FATAL_FAILURE(RunReferencePrompts(CudaConfig(path, "auto", 16, 2048, 8, true, quantization, "fp8_e4m3"),
                                                ref, &runs.emplace_back()));
  }
  double worst[2] = {}, apart = 0;
  for (int run = 0; run < 2; ++run) {
    std::vector<std::vector<int32_t>> tokens;
    for (const auto& sink : runs[run]) tokens.push_back(sink->tokens);
    const Agreement a = Agree(tokens, ref, 0.5);
    EXPECT_EQ(a.agreed, a.compared) << (run ? "scaled: " : "unscaled: ") << a.first_mismatch;
    EXPECT_GT(a.compared, 5);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto& steps = ref["cases"][i]["steps"];
      for (size_t s = 0; s < steps.size() && steps[s]["margin"].get<double>() >= 0.5; ++s) {
        worst[run] =
            std::max(worst[run], std::abs(runs[run][i]->logprobs[s].logprob - steps[s]["top"][0][1].get<double>()));
        if (run == 1)
          apart = std::max(apart, double{std::abs(runs[1][i]->logprobs[s].logprob - runs[0][i]->logprobs[s].logprob)});
      }
    }
    EXPECT_LT(worst[run], 0.25) << (run ? "scaled" : "unscaled");
  }
  EXPECT_LT(apart, 0.1);
  std::printf(
      "[ parity   ] mistral-hd128-g3 fp8 KV with the checkpoint's scales (K 2, V 4): worst chosen-logprob "
      "error %.4f (scale 1: %.4f), %.4f apart\n",
      worst[1], worst[0], apart);
}

// Models of large activations ("-sharp": every weight of std 0.2, attention logits of std ~20), where a bf16
// rounding anywhere flips tokens whose margin is well over 0.1 and greedy runs part after the first flip: each
// position is compared with the context fixed to the fp32 reference's tokens (teacher forcing), which measures
// the arithmetic alone. The cuda backend must pick fp32's token at least as often as transformers' own bf16 run
// does along the same tokens, with a chosen-token logprob error no larger.
struct SharpCase {
  const char* model;
  const char* dtype = "bfloat16";
  int32_t block_size = 16;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 32;  // 1: every request alone
  bool cuda_graphs = true;
  // Tolerances against transformers' bf16 run: the logprob RMS error may exceed its by this factor, the agreement
  // fall short of its by this many positions. 1 and 0 but for the mixtures of experts: there a rounding now and then
  // sends a row to another expert (in transformers' bf16 run as in inferd's), at a few positions, whose errors make
  // most of the RMS, so the figures move with the batching (which sums in which order). Measured on an H200
  // (2026-11-27), three batchings each: mixtral-hd128 agreeing at 206-209 of 214 positions (transformers 205), RMS
  // 0.108-0.157 (0.151); qwen3-moe-hd128 at 217-219 of 221 (218), RMS 0.075-0.127 (0.098), on average 0.093 — as
  // close as transformers' own bf16 run on the whole, not in every batching.
  double rms_slack = 1.0;
  int32_t agreement_slack = 0;
};

// Top-1 agreement with the fp32 reference and the RMS error of the reference token's logprob, over the positions
// whose fp32 margin is at least 0.1. `top` per (prompt, position): the run's top-5 (id, logprob), best first.
struct Closeness {
  int agreed = 0, compared = 0;
  double sum_sq = 0;
  int with_error = 0;
  double rms() const { return with_error ? std::sqrt(sum_sq / with_error) : 0.0; }
};

Closeness Compare(const nlohmann::json& fp32,
                  const std::vector<std::vector<std::vector<std::pair<int32_t, double>>>>& top) {
  Closeness c;
  for (size_t i = 0; i < top.size(); ++i) {
    const auto& steps = fp32["cases"][i]["steps"];
    for (size_t s = 0; s < top[i].size(); ++s) {
      if (steps[s]["margin"].get<double>() < 0.1) continue;
      const int32_t want = steps[s]["token"].get<int32_t>();
      ++c.compared;
      if (!top[i][s].empty() && top[i][s][0].first == want) ++c.agreed;
      for (const auto& [id, lp] : top[i][s]) {
        if (id != want) continue;
        const double err = lp - steps[s]["top"][0][1].get<double>();
        c.sum_sq += err * err;
        ++c.with_error;
      }
    }
  }
  return c;
}

class SharpParity : public ::testing::TestWithParam<SharpCase> {};

TEST_P(SharpParity, TeacherForcedTokensAsCloseToFp32AsTransformersBf16) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const SharpCase& c = GetParam();
  const std::string fp32_path = std::string(dir) + "/reference/" + c.model + ".json";
  const std::string bf16_path = std::string(dir) + "/reference/" + c.model + "-bf16.json";
  if (!std::filesystem::exists(fp32_path) || !std::filesystem::exists(bf16_path)) {
    FAIL() << fp32_path << " or " << bf16_path << " is missing"
           << ": a parity run with nothing to compare fails";
  }
  const nlohmann::json fp32 = testing::ReadJson(fp32_path), bf16 = testing::ReadJson(bf16_path);
  auto engine = Engine::Create(CudaConfig(std::string(dir) + "/" + c.model, c.dtype, c.block_size,
                                          c.max_num_batched_tokens, c.max_num_seqs, c.cuda_graphs));
  ASSERT_TRUE(engine.ok()) << engine.status();

  // One request per (prompt, position): the prompt and the fp32 run's tokens before the position, one token out.
  // And one per prompt with all of them, scored by prompt_logprobs: the same positions in one prefill.
  const size_t num_prompts = fp32["cases"].size();
  std::vector<std::vector<std::shared_ptr<testing::CollectingSink>>> sinks(num_prompts);
  std::vector<std::shared_ptr<testing::CollectingSink>> scored;
  for (size_t i = 0; i < num_prompts; ++i) {
    const auto& ref_case = fp32["cases"][i];
    std::vector<int32_t> context = ref_case["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& step : ref_case["steps"]) {
      Request r;
      r.id = absl::StrCat("forced-", i, "-", sinks[i].size());
      r.prompt = context;
      r.sampling.temperature = 0;
      r.stopping.max_tokens = 1;
      r.stopping.ignore_eos = true;
      r.top_logprobs = 5;
      sinks[i].push_back(std::make_shared<testing::CollectingSink>());
      r.sink = sinks[i].back();
      ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
      context.push_back(step["token"].get<int32_t>());
    }
    Request r;
    r.id = absl::StrCat("scored-", i);
    r.prompt = context;
    r.stopping.max_tokens = 1;
    r.prompt_logprobs = 5;
    scored.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = scored.back();
    ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  std::vector<std::vector<std::vector<std::pair<int32_t, double>>>> ours(num_prompts), theirs(num_prompts),
      prompt_rows(num_prompts);
  for (size_t i = 0; i < num_prompts; ++i) {
    ASSERT_TRUE(scored[i]->WaitFor(absl::Seconds(300)));
    const size_t first = fp32["cases"][i]["prompt_ids"].size() - 1;  // the row scoring the first forced token
    ASSERT_EQ(scored[i]->prompt_logprobs.size(), first + fp32["cases"][i]["steps"].size()) << scored[i]->error;
    for (size_t p = first; p < scored[i]->prompt_logprobs.size(); ++p) {
      prompt_rows[i].emplace_back();
      for (const auto& alt : scored[i]->prompt_logprobs[p].top)
        prompt_rows[i].back().push_back({alt.token_id, alt.logprob});
    }
    for (auto& sink : sinks[i]) {
      ASSERT_TRUE(sink->WaitFor(absl::Seconds(300)));
      ASSERT_EQ(sink->tokens.size(), 1u) << sink->error;
      ours[i].emplace_back();
      for (const auto& alt : sink->logprobs[0].top) ours[i].back().push_back({alt.token_id, alt.logprob});
    }
    ASSERT_TRUE(bf16["cases"][i].contains("forced")) << "bf16 reference made without --forced-on-fp32";
    for (const auto& step : bf16["cases"][i]["forced"]) {
      theirs[i].emplace_back();
      for (const auto& alt : step["top"]) theirs[i].back().push_back({alt[0].get<int32_t>(), alt[1].get<double>()});
    }
  }
  const Closeness got = Compare(fp32, ours), baseline = Compare(fp32, theirs), rows = Compare(fp32, prompt_rows);
  std::printf(
      "[ parity   ] %s %s block %d budget %d seqs %d%s, along fp32's tokens: inferd picks fp32's token at %d "
      "of %d positions (logprob RMS error %.4f), its prompt_logprobs at %d of %d (%.4f), transformers bf16 at %d "
      "(%.4f)\n",
      c.model, c.dtype, c.block_size, c.max_num_batched_tokens, c.max_num_seqs, c.cuda_graphs ? "" : " eager",
      got.agreed, got.compared, got.rms(), rows.agreed, rows.compared, rows.rms(), baseline.agreed, baseline.rms());
  EXPECT_EQ(rows.compared, got.compared);
  EXPECT_GE(rows.agreed, baseline.agreed - c.agreement_slack) << "prompt_logprobs " << c.model;
  EXPECT_LE(rows.rms(), baseline.rms() * c.rms_slack) << "prompt_logprobs " << c.model << " " << c.dtype;
  EXPECT_GT(got.compared, static_cast<int>(num_prompts) * 32 / 2) << "most positions are compared";
  EXPECT_GE(got.agreed, baseline.agreed - c.agreement_slack) << c.model << " " << c.dtype;
  EXPECT_LE(got.rms(), baseline.rms() * c.rms_slack) << c.model << " " << c.dtype;
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back once all requests finished";
}

// Every shape in bf16 and fp16, the mixtures of experts in bf16; the shape (4 query heads on 1 KV head of 128)
// also alone, eager, and on small pages with a small prefill budget.
std::vector<SharpCase> SharpCases() {
  std::vector<SharpCase> cases;
  for (const char* m : {"qwen2-hd128-g4-kv1-sharp", "qwen2-hd64-g7-sharp", "llama3-hd64-g4-sharp",
                        "llama-hd256-g8-sharp", "mistral-hd128-g1-sharp"}) {
    for (const char* dtype : {"bfloat16", "float16"}) cases.push_back({m, dtype});
  }
  cases.push_back({"qwen2-hd128-g4-kv1-sharp", "bfloat16", 16, 2048, 1});
  cases.push_back({"qwen2-hd128-g4-kv1-sharp", "bfloat16", 5, 512, 32, false});
  // Mixtures of experts in bf16, where a rounding may send a row to another expert (transformers' bf16 run too).
  for (const char* m : {"mixtral-hd128", "qwen3-moe-hd128"}) {
    cases.push_back({m, "bfloat16", 16, 2048, 32, true, 1.35, 1});
    cases.push_back({m, "bfloat16", 16, 2048, 1, true, 1.35, 1});
    cases.push_back({m, "bfloat16", 3, 24, 8, true, 1.35, 1});
  }
  cases.push_back({"qwen3-moe-hd128", "float16"});
  cases.push_back({"qwen3-moe-hd128", "float16", 5, 512, 32, false});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, SharpParity, ::testing::ValuesIn(SharpCases()), [](const auto& info) {
  std::string n = info.param.model;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n + "_" + info.param.dtype + "_bs" + std::to_string(info.param.block_size) + "_budget" +
         std::to_string(info.param.max_num_batched_tokens) + "_seqs" + std::to_string(info.param.max_num_seqs) +
         (info.param.cuda_graphs ? "" : "_eager");
});

// fp8 on the large-activation models (head_dim 256, GQA groups 1, 4, 7 and 8, one KV head; prompts of 759 and 3,000
// tokens too), teacher-forced along their -fp8a8 reference's own greedy tokens: each prompt and its reference
// tokens go in as one prompt scored by prompt_logprobs, once with engine.quantization fp8 and once without. On these
// models an input that the engine (from bf16) and the reference (from fp32) round to neighbouring e4m3 values moves
// a logit far more than on the others: about one input in 16 lands that way, each by a 6 % step, which makes ~7x
// the noise of bf16 rounding — the logprob RMS error transformers' own bf16 run shows against fp32 here is
// 0.15-0.26, so ~1 is expected. What the test holds: the fp8 run follows the fp8 reference much more closely than
// the same engine without fp8 does (the quantization is the reference's), and its top token is the reference's at
// most clear positions. Measured on the H100 (2026-11-24): fp8 RMS 0.63-1.00 and agreement 75-83 %, bf16 1.87-2.55
// and 45-66 %. The mixtures of experts too (fp8 experts: streamed against bf16 rows where a step's runs are short,
// quantized per row through the grouped GEMM where they are long, as the reference quantizes them).
class Fp8Sharp : public ::testing::TestWithParam<const char*> {};

// Teacher-forced closeness to a reference along its own tokens: top-token agreement at positions of margin >= 0.5
// and the RMS error of the reference token's logprob over every position.
Closeness ForcedAlong(const nlohmann::json& ref, const Config& config) {
  Closeness c;
  auto engine = Engine::Create(config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return c;
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    Request r;
    r.id = absl::StrCat("forced-", i);
    r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& step : ref["cases"][i]["steps"]) r.prompt.push_back(step["token"].get<int32_t>());
    r.stopping.max_tokens = 1;
    r.prompt_logprobs = 1;
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks.back();
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    EXPECT_TRUE(sinks[i]->WaitFor(absl::Seconds(300)));
    const auto& steps = ref["cases"][i]["steps"];
    const size_t first = ref["cases"][i]["prompt_ids"].size() - 1;  // the row scoring the first reference token
    EXPECT_EQ(sinks[i]->prompt_logprobs.size(), first + steps.size()) << sinks[i]->error;
    if (sinks[i]->prompt_logprobs.size() != first + steps.size()) continue;
    for (size_t s = 0; s < steps.size(); ++s) {
      const TokenLogprob& row = sinks[i]->prompt_logprobs[first + s];
      const double err = row.logprob - steps[s]["top"][0][1].get<double>();
      c.sum_sq += err * err;
      ++c.with_error;
      if (steps[s]["margin"].get<double>() < 0.5) continue;
      ++c.compared;
      c.agreed += !row.top.empty() && row.top[0].token_id == steps[s]["token"].get<int32_t>();
    }
  }
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "every block is back once all requests finished";
  return c;
}

TEST_P(Fp8Sharp, TeacherForcedTheFp8RunFollowsTheFp8ReferenceFarCloserThanBf16) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const std::string model = GetParam();
  // At tensor_parallel_size N the reference that quantizes the row-parallel inputs per rank's slice, as N ranks do.
  const std::string suffix = TensorParallelSize() > 1 ? absl::StrCat("-fp8a8-tp", TensorParallelSize()) : "-fp8a8";
  const std::string ref_path = std::string(dir) + "/reference/" + model + suffix + ".json";
  if (!std::filesystem::exists(ref_path))
    FAIL() << ref_path << " is missing"
           << ": a parity run with nothing to compare fails (tools/make_reference_fixtures.py writes it)";
  const nlohmann::json ref = testing::ReadJson(ref_path);
  const std::string model_dir = std::string(dir) + "/" + model;
  if (TensorParallelSize() > 1) {  // a model whose heads cannot be split over N ranks is not run at N (refused)
    auto loaded = LoadModel(model_dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const absl::Status split = CheckTensorParallel((*loaded)->config, TensorParallelSize());
    if (!split.ok()) GTEST_SKIP() << split.message();
  }
  const Closeness fp8 = ForcedAlong(ref, CudaConfig(model_dir, "auto", 16, 2048, 32, true, "fp8"));
  const Closeness bf16 = ForcedAlong(ref, CudaConfig(model_dir, "auto", 16, 2048, 32, true, "none"));
  std::printf(
      "[ parity   ] %s%s, teacher-forced along its tokens: fp8 picks its token at %d of %d positions of "
      "margin >= 0.5 (logprob RMS error %.4f over %d), bf16 at %d (%.4f)\n",
      model.c_str(), suffix.c_str(), fp8.agreed, fp8.compared, fp8.rms(), fp8.with_error, bf16.agreed, bf16.rms());
  EXPECT_GE(fp8.compared, fp8.with_error / 2) << "most positions are clear enough to compare";
  EXPECT_GE(fp8.agreed, 0.7 * fp8.compared) << model;
  EXPECT_GT(fp8.agreed, bf16.agreed) << model;
  // A mixture's RMS is mostly the few positions where a rounding sends a row to another expert (an expert carries
  // half of Mixtral's output), so there it is held to less than bf16's alone. Measured on an H200 (2026-11-27):
  // mixtral-hd128 fp8 162 of 193, RMS 3.21 (bf16 140, 3.81); qwen3-moe-hd128 191 of 213, 0.89 (184, 1.52).
  const bool mixture = model.find("moe") != std::string::npos || model.starts_with("mixtral");
  if (!mixture) {
    EXPECT_LT(fp8.rms(), 1.25) << model;
  }
  EXPECT_LT(fp8.rms(), (mixture ? 1.0 : 0.75) * bf16.rms()) << model;
}

INSTANTIATE_TEST_SUITE_P(Models, Fp8Sharp,
                         ::testing::Values("llama-hd256-g8-sharp", "qwen2-hd128-g4-kv1-sharp", "qwen2-hd64-g7-sharp",
                                           "llama3-hd64-g4-sharp", "mistral-hd128-g1-sharp", "mixtral-hd128",
                                           "qwen3-moe-hd128"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Decodes `n` greedy requests of like-length random prompts, `steps` tokens each, top-2 logprobs kept.
std::vector<std::shared_ptr<testing::CollectingSink>> DecodeMany(const std::string& model_dir, bool cuda_graphs,
                                                                 int32_t n, int32_t steps,
                                                                 const std::string& plan_ahead = "auto",
                                                                 const std::string& backend = "cuda",
                                                                 const std::string& kv_cache_dtype = "auto") {
  Config config;
  config.model.path = model_dir;
  config.engine.backend = backend;
  config.engine.kv_cache_dtype = kv_cache_dtype;
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

// 80 rows of 2 KV heads fill 132 SMs with like-length contexts: their decode steps replay the bucket's graph with
// unsplit KV attention, which must pick the tokens the kernels launched one by one pick (FlashInfer's own split).
// Over an fp8 cache the graphs run kernels/decode_attention.h's tensor-core kernel, whose probabilities are f16
// where FlashInfer's are bf16: the two part at near-ties (H200: 8 of 80 requests, at eager top-2 margins of
// 0.0004–0.063), so there the comparison stops at a margin of 0.1, the parity tests' threshold.
TEST(CudaBackend, DecodeGraphsWithUnsplitKvAttentionPickTheTokensOfEagerSteps) {
  const char* dir = std::getenv("INFERD_GPU_MODELS");
  if (!dir) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  const std::string model_dir = std::string(dir) + "/qwen2-hd128";  // 2 KV heads, bf16
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int32_t n = 80;
  if (n * 2 < sms) GTEST_SKIP() << n << " rows of 2 KV heads do not fill " << sms << " SMs";
  for (const std::string kv : {"auto", "fp8_e4m3"}) {
    const auto graphs = DecodeMany(model_dir, true, n, 12, "auto", "cuda", kv);
    const auto eager = DecodeMany(model_dir, false, n, 12, "auto", "cuda", kv);
    EXPECT_GT(testing::SameTokensUntilANearTie(graphs, eager, kv == "auto" ? 0.05 : 0.1), n * 10 / 2)
        << "most positions are compared, not skipped (KV cache " << kv << ")";
  }
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
    EXPECT_GT(testing::SameTokensUntilANearTie(ahead, one_by_one, 0.05), 40 * 14 / 2) << (graphs ? "graphs" : "eager");
  }
}

// Google's Gemma 3 270M (Q4_K_M GGUF, fetched by scripts/setup.sh; not in the tree, so it reaches a GPU host only
// where someone put it in models/) on cuda in bf16 against transformers run in fp32 on the same GGUF: real weights
// through the dequantizing upload, one KV head of 256, a 262k vocabulary and sliding windows. Positions are
// compared up to the reference's first margin under 0.25 (bf16 moves a real model's logprobs by hundredths).
TEST(CudaParity, Gemma3_270mRealWeightsMatchTransformersOnTheSameGguf) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  const std::string path = testing::SourcePath("models/gemma-3-270m-q4_k_m.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here (scripts/setup.sh fetches it)";
  const nlohmann::json ref = testing::ReadJson(testing::SourcePath("tests/fixtures/reference/gemma3-270m.json"));
  for (int32_t block_size : {16, 3}) {
    std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
    RunReferencePrompts(CudaConfig(path, "auto", block_size, block_size == 3 ? 24 : 2048, 8, true), ref, &sinks);
    std::vector<std::vector<int32_t>> tokens;
    double worst = 0;
    for (size_t i = 0; i < sinks.size(); ++i) {
      tokens.push_back(sinks[i]->tokens);
      const auto& steps = ref["cases"][i]["steps"];
      for (size_t s = 0; s < steps.size() && steps[s]["margin"].get<double>() >= 0.25; ++s) {
        if (sinks[i]->tokens[s] != steps[s]["token"].get<int32_t>()) break;
        worst = std::max(worst, std::abs(sinks[i]->logprobs[s].logprob - steps[s]["top"][0][1].get<double>()));
      }
    }
    const Agreement got = Agree(tokens, ref, 0.25);
    std::printf(
        "[ parity   ] gemma3-270m Q4_K_M bf16 block %d: %d of %d positions agree, worst chosen-logprob error %.4f\n",
        block_size, got.agreed, got.compared, worst);
    EXPECT_TRUE(got.first_mismatch.empty()) << got.first_mismatch;
    EXPECT_GT(got.compared, static_cast<int>(sinks.size()) * 4) << "positions are compared, not skipped";
    EXPECT_LT(worst, 0.25);
  }
}

// A mixture of experts from its GGUF file (Mixtral as llama.cpp writes it: "llama" with experts stacked in 3-D
// tensors) on cuda agrees with transformers' fp32 as its Hugging Face directory does, up to each prompt's first
// margin under 0.1 (its heads of 16 run padded to 64).
TEST(CudaBackend, AMixtureServesFromItsGgufFile) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  const nlohmann::json ref = testing::ReadJson(testing::SourcePath("tests/fixtures/reference/mixtral-tiny.json"));
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  RunReferencePrompts(CudaConfig(testing::ModelDir("mixtral-tiny") + ".gguf", "float16", 16, 2048, 8, true), ref,
                      &sinks);
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& sink : sinks) tokens.push_back(sink->tokens);
  const Agreement got = Agree(tokens, ref);
  std::printf("[ parity   ] mixtral-tiny.gguf float16 on cuda: %d of %d positions agree\n", got.agreed, got.compared);
  EXPECT_TRUE(got.first_mismatch.empty()) << got.first_mismatch;
  EXPECT_GE(got.compared, static_cast<int>(tokens.size()) * 2) << "positions are compared";
}

// Heads the attention kernels have no head dim for run padded with zeros to the next one (head_padding.h): the
// tiny fixtures' heads of 16 at 64, with partial rotary and LongRoPE on phi3-tiny, agree with transformers' fp32
// (their committed references) in fp16 up to each prompt's first margin under 0.1. A head dim above every kernel's
// is refused for cuda by name and served on the cpu by auto.
TEST(CudaBackend, HeadsTheKernelsLackRunPaddedAndHeadsAboveThemAreRefusedForCuda) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  for (const char* model : {"llama3-tiny", "phi3-tiny"}) {
    const nlohmann::json ref =
        testing::ReadJson(testing::SourcePath(std::string("tests/fixtures/reference/") + model + ".json"));
    std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
    RunReferencePrompts(CudaConfig(testing::ModelDir(model), "float16", 16, 2048, 8, true), ref, &sinks);
    std::vector<std::vector<int32_t>> tokens;
    for (const auto& sink : sinks) tokens.push_back(sink->tokens);
    const Agreement got = Agree(tokens, ref);
    std::printf("[ parity   ] %s float16 on cuda, heads padded to 64: %d of %d positions agree\n", model, got.agreed,
                got.compared);
    EXPECT_TRUE(got.first_mismatch.empty()) << model << ": " << got.first_mismatch;
    EXPECT_GE(got.compared, static_cast<int>(tokens.size()) * 2) << model << ": positions are compared";
  }
  // Past original_max_position_embeddings (256 for phi3-tiny) LongRoPE turns by its long factors, a table of its own
  // that the padded heads' kernels find by the padded head dim: prompts of 300-560 tokens, fp16 on cuda against the
  // cpu backend's fp32, tokens equal until the cpu run's first margin under 0.1.
  {
    std::vector<std::vector<int32_t>> prompts;
    std::mt19937 rng(9);
    for (int32_t len : {300, 420, 560}) {
      std::vector<int32_t>& p = prompts.emplace_back();
      for (int32_t t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(3 + rng() % 600));
    }
    std::vector<testing::GreedyRun> runs;
    for (const char* backend : {"cuda", "cpu"}) {
      Config config = CudaConfig(testing::ModelDir("phi3-tiny"), "float16", 16, 2048, 8, true);
      config.engine.backend = backend;
      config.engine.cpu_kv_cache_gib = 0.05;
      runs.push_back(testing::RunGreedy(config, prompts, 8));
    }
    const testing::GreedyRun& cuda = runs[0];
    const testing::GreedyRun& cpu = runs[1];
    ASSERT_EQ(cuda.tokens.size(), prompts.size());
    ASSERT_EQ(cpu.tokens.size(), prompts.size());
    int compared = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(cuda.tokens[i].size(), cpu.tokens[i].size());
      for (size_t s = 0; s < cpu.tokens[i].size(); ++s) {
        const auto& top = cpu.logprobs[i][s].top;
        if (top.size() < 2 || top[0].logprob - top[1].logprob < 0.1) break;
        EXPECT_EQ(cuda.tokens[i][s], cpu.tokens[i][s]) << "prompt " << i << " step " << s;
        EXPECT_NEAR(cuda.logprobs[i][s].logprob, cpu.logprobs[i][s].logprob, 0.05) << "prompt " << i << " step " << s;
        if (cuda.tokens[i][s] != cpu.tokens[i][s]) break;
        ++compared;
      }
    }
    std::printf("[ parity   ] phi3-tiny past its original context, heads padded to 64: %d positions compared\n",
                compared);
    EXPECT_GE(compared, 3) << "positions are compared";
  }
  const std::string dir = ::testing::TempDir() + "/llama-hd288";
  std::filesystem::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(testing::ModelDir("llama3-tiny") + "/" + f, dir + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  }
  nlohmann::json cfg = testing::ReadJson(testing::ModelDir("llama3-tiny") + "/config.json");
  cfg["head_dim"] = 288;
  std::ofstream(dir + "/config.json") << cfg.dump();
  Config config;
  config.model.path = dir;
  config.model.load_format = "dummy";
  config.engine.backend = "cuda";
  config.engine.cpu_kv_cache_gib = 0.01;
  auto refused = Engine::Create(config);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("head_dim = 288"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("up to 256"), std::string::npos) << refused.status();
  config.engine.backend = "auto";
  auto served = Engine::Create(config);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ((*served)->backend_name(), "cpu");
}

}  // namespace
}  // namespace inferd

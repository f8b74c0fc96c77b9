// The cuda backend's tensor-parallel path on one GPU (several GPUs run it in scripts/gpu_run.sh tp):
// - the sharded loader: each rank's weights on the device are exactly its slice of the whole model's (rows of the
//   column-parallel products, columns of the row-parallel ones, biases, the LM head on rank 0 only), for 2, 4 and
//   8 ranks on models with tied and untied embeddings, QKV biases, one KV head replicated, an fp16 file decoded;
// - the NCCL path with one rank: a backend whose every step sums over its one rank and broadcasts rank 0's tokens
//   through NCCL, in decode graphs and step by step, picks the tokens and logprobs of the plain path bit for bit;
// - 2 and 4 ranks sharing this GPU (summing through the one-shot peer kernels, steps launched kernel by kernel):
//   the whole sharded forward pass, prefill chunks and decode, picks the unsharded model's greedy tokens up to
//   near-ties (each rank's partial products are rounded to bf16 before the sum, which the whole product never is);
// - a size this machine cannot hold is refused naming the field.
// Skips without a GPU or without INFERD_GPU_MODELS.
#include "engine/model/tensor_parallel.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/cuda_weights.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "tests/unit/collecting_sink.h"

namespace inferd {
namespace {

std::vector<uint8_t> ToHost(const cuda::DeviceBuffer& b) {
  std::vector<uint8_t> h(b.bytes());
  if (!h.empty()) {
    EXPECT_EQ(cudaMemcpy(h.data(), b.get(), h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

// Rows `rows`, columns `cols` of a row-major matrix `width` elements wide, of `e` bytes each.
std::vector<uint8_t> Slice(const std::vector<uint8_t>& m, int64_t width, IndexRange rows, IndexRange cols, int64_t e) {
  std::vector<uint8_t> out;
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const uint8_t* row = m.data() + (r * width + cols.begin) * e;
    out.insert(out.end(), row, row + cols.size() * e);
  }
  return out;
}

std::vector<uint8_t> RowsOf(const std::vector<uint8_t>& m, int64_t width, const std::vector<IndexRange>& rows,
                            int64_t e) {
  std::vector<uint8_t> out;
  for (const IndexRange& r : rows) {
    const auto part = Slice(m, width, r, {0, width}, e);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

const char* GpuModels() {
  return std::getenv("INFERD_GPU_MODELS");
}

TEST(TensorParallelOnCuda, EachRanksWeightsAreItsSliceOfTheWholeModel) {
  if (!GpuModels()) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  struct Case {
    const char* model;
    cudaDataType_t dtype;
    bool fp8;
  };
  // qwen2-hd128: QKV biases, tied, 2 KV heads (replicated at 4 ranks). llama-hd256-g8-sharp: untied, 1 KV head.
  // mistral-hd128-g3: an fp16 file decoded to bf16, 6 heads (2 ranks only). llama3-hd64 in fp8: its rows quantized
  // as they arrive, per row over the whole row.
  for (const Case& k : {Case{"qwen2-hd128", CUDA_R_16BF, false}, Case{"llama-hd256-g8-sharp", CUDA_R_16BF, false},
                        Case{"mistral-hd128-g3", CUDA_R_16BF, false}, Case{"llama3-hd64", CUDA_R_16BF, true}}) {
    auto model = LoadModel(std::string(GpuModels()) + "/" + k.model);
    ASSERT_TRUE(model.ok()) << model.status();
    const ModelConfig& c = (*model)->config;
    auto whole = cuda::UploadWeights((*model)->tensors, k.dtype, k.fp8, ShardOf(c, 1, 0), c);
    ASSERT_TRUE(whole.ok()) << whole.status();
    const int64_t e = k.fp8 ? 1 : 2, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
    int checked = 0;
    for (int32_t n : {2, 4, 8}) {
      if (!CheckTensorParallel(c, n).ok()) continue;
      for (int32_t rank = 0; rank < n; ++rank) {
        SCOPED_TRACE(std::string(k.model) + " rank " + std::to_string(rank) + " of " + std::to_string(n));
        const TensorParallelShard s = ShardOf(c, n, rank);
        auto part = cuda::UploadWeights((*model)->tensors, k.dtype, k.fp8, s, c);
        ASSERT_TRUE(part.ok()) << part.status();
        EXPECT_EQ(ToHost(part->embed), ToHost(whole->embed));
        // Rank 0 holds the whole LM head, the others their vocabulary runs (nothing of their own when tied).
        EXPECT_EQ(part->vocab.begin, s.vocab.begin);
        EXPECT_EQ(part->vocab.end, s.vocab.end);
        if (rank == 0) {
          EXPECT_EQ(ToHost(part->lm_head_own), ToHost(whole->lm_head_own));
        } else if (whole->lm_head_own.bytes()) {
          EXPECT_EQ(ToHost(part->lm_head_own), RowsOf(ToHost(whole->lm_head_own), H, {s.vocab}, 2));
        } else {
          EXPECT_EQ(part->lm_head_own.bytes(), 0u);
        }
        for (int l = 0; l < c.num_layers; ++l) {
          const cuda::CudaLayerWeights& w = whole->layers[l];
          const cuda::CudaLayerWeights& p = part->layers[l];
          EXPECT_EQ(ToHost(p.qkv.data), RowsOf(ToHost(w.qkv.data), H, s.QkvRows(c), e)) << "layer " << l;
          EXPECT_EQ(ToHost(p.gate_up.data), RowsOf(ToHost(w.gate_up.data), H, s.GateUpRows(c), e)) << "layer " << l;
          if (k.fp8) {  // per-row scales of the row-split products are the whole row's
            EXPECT_EQ(ToHost(p.qkv.scale), RowsOf(ToHost(w.qkv.scale), 1, s.QkvRows(c), 4));
            EXPECT_EQ(ToHost(p.gate_up.scale), RowsOf(ToHost(w.gate_up.scale), 1, s.GateUpRows(c), 4));
            continue;  // the column-split ones are quantized over the rank's columns: their own scales
          }
          EXPECT_EQ(ToHost(p.o.data),
                    Slice(ToHost(w.o.data), c.q_width(), {0, H}, {s.q_heads.begin * D, s.q_heads.end * D}, e))
              << "layer " << l;
          EXPECT_EQ(ToHost(p.down.data), Slice(ToHost(w.down.data), I, {0, H}, s.intermediate, e)) << "layer " << l;
          if (w.qkv_bias.bytes()) {
            std::vector<uint8_t> bias;
            for (const IndexRange& r : s.QkvRows(c)) {
              const auto cols = Slice(ToHost(w.qkv_bias), c.qkv_width(), {0, 1}, r, 2);
              bias.insert(bias.end(), cols.begin(), cols.end());
            }
            EXPECT_EQ(ToHost(p.qkv_bias), bias) << "layer " << l;
          }
          EXPECT_EQ(ToHost(p.input_norm), ToHost(w.input_norm));
        }
        ++checked;
      }
    }
    EXPECT_GE(checked, 2) << k.model << ": at least one size splits it";
  }
}

// Greedy decoding of 24 random prompts with top-2 logprobs, on `ranks` ranks laid out by `options`.
std::vector<std::shared_ptr<testing::CollectingSink>> Decode(const std::string& model_dir, bool cuda_graphs,
                                                             CudaRankOptions options, int32_t ranks = 1) {
  Config config;
  config.engine.tensor_parallel_size = ranks;
  config.engine.num_blocks = 2048;  // ranks sharing the GPU each hold a pool
  config.model.path = model_dir;
  config.engine.backend = "cuda";
  config.engine.cuda_graphs = cuda_graphs;
  config.engine.gpu_memory_utilization = 0.3;
  config.scheduler.max_num_seqs = 16;
  config.scheduler.max_num_batched_tokens = 256;  // the long prompts run in chunks
  auto engine = Engine::Create(
      config, [&](const Config& cfg, const Model& model) { return CreateCudaBackend(model, cfg.engine, options); });
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::mt19937 rng(9);
  std::vector<std::shared_ptr<testing::CollectingSink>> sinks;
  for (int32_t i = 0; i < 24; ++i) {
    Request r;
    r.id = "tp-" + std::to_string(i);
    for (uint32_t t = 0, len = 8 + rng() % 400; t < len; ++t)
      r.prompt.push_back(static_cast<int32_t>(10 + rng() % 500));
    r.sampling.temperature = 0;
    r.stopping.max_tokens = 20 + i % 7;
    r.stopping.ignore_eos = true;
    r.top_logprobs = 2;
    sinks.push_back(std::make_shared<testing::CollectingSink>());
    r.sink = sinks.back();
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);  // for all of them: a stuck engine fails once
  for (auto& sink : sinks) EXPECT_TRUE(sink->WaitFor(std::max(absl::ZeroDuration(), deadline - absl::Now())));
  return sinks;
}

TEST(TensorParallelOnCuda, OneRankThroughNcclPicksThePlainPathsTokensAndLogprobsBitForBit) {
  if (!GpuModels()) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  for (const char* m : {"qwen2-hd128", "llama3-hd64"}) {
    for (bool graphs : {true, false}) {
      SCOPED_TRACE(std::string(m) + (graphs ? " in decode graphs" : " step by step"));
      const std::string dir = std::string(GpuModels()) + "/" + m;
      const auto plain = Decode(dir, graphs, {});
      const auto nccl = Decode(dir, graphs, {.collectives_on_one_gpu = true});
      ASSERT_EQ(plain.size(), nccl.size());
      size_t tokens = 0;
      for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_TRUE(plain[i]->error.ok() && nccl[i]->error.ok()) << plain[i]->error << nccl[i]->error;
        EXPECT_EQ(plain[i]->tokens, nccl[i]->tokens) << "request " << i;
        ASSERT_EQ(plain[i]->logprobs.size(), nccl[i]->logprobs.size());
        for (size_t t = 0; t < plain[i]->logprobs.size(); ++t) {
          EXPECT_EQ(plain[i]->logprobs[t].logprob, nccl[i]->logprobs[t].logprob) << "request " << i << " step " << t;
        }
        tokens += plain[i]->tokens.size();
      }
      EXPECT_GT(tokens, 24u * 20);
    }
  }
}

// A rank's partial products are rounded to bf16 before the sum over the ranks, as the whole product never is: the
// chosen tokens' logprobs move by about as much as the whole model's own bf16 rounding moves them from fp32 (on one
// H100: 0.03 on llama3-hd64, 0.02 on mistral-hd128-g3, 0.13 and 0.16 at 2 and 4 ranks on qwen2-hd128, whose whole
// bf16 run is 0.14 from fp32 in the parity suite). So: tokens up to a top-2 margin of 0.15, and logprobs within
// the parity suite's tolerance against transformers, 0.25.
constexpr double kNearTie = 0.15, kLogprobTolerance = 0.25;

TEST(TensorParallelOnCuda, RanksSharingTheGpuPickTheWholeModelsTokensUpToNearTies) {
  if (!GpuModels()) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  // llama3-hd64: 4 heads on 1 KV head (replicated), untied. qwen2-hd128: QKV biases, tied, 2 KV heads.
  // mistral-hd128-g3: 6 heads on 2 KV heads (2 ranks only), an fp16 checkpoint run in bf16.
  // qwen3-hd128, gemma3-hd256, phi3-hd128: the families' blocks (per-head norms, sandwich norms and windows,
  // partial rotary; phi3-hd96's heads padded to 128) on each rank's shard. gemma3-hd256 and the Phi-3s from a margin of
  // 0.25: rounding moves their bf16 logprobs more (transformers' own bf16 run by up to 0.12 and 0.14; split over ranks
  // here by up to 0.19), and their tokens flipped at margins of 0.16-0.21 (measured on two H200s). Past the margin a
  // flip is still the rounding's, not the split's, where each run puts the other's token second with a logprob
  // within kLogprobTolerance of the other run's (gemma3-hd256 on 2 ranks sharing one H200 flipped at 0.26, its chosen
  // logprobs moved by up to 0.13): counted and printed; any other flip fails.
  for (auto [m, near_tie] : std::initializer_list<std::pair<const char*, double>>{{"llama3-hd64", kNearTie},
                                                                                  {"qwen2-hd128", kNearTie},
                                                                                  {"mistral-hd128-g3", kNearTie},
                                                                                  {"qwen3-hd128", kNearTie},
                                                                                  {"gemma3-hd256", 0.25},
                                                                                  {"phi3-hd128", 0.25},
                                                                                  {"phi3-hd96", 0.25}}) {
    const std::string dir = std::string(GpuModels()) + "/" + m;
    auto model = LoadModel(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    const auto whole = Decode(dir, true, {});
    for (int32_t n : {2, 4}) {
      if (!CheckTensorParallel((*model)->config, n).ok()) continue;
      {
        SCOPED_TRACE(std::string(m) + " on " + std::to_string(n) + " ranks");
        const auto split = Decode(dir, false, {.ranks_share_gpu = true}, n);
        ASSERT_EQ(split.size(), whole.size());
        size_t compared = 0, total = 0, rounding_flips = 0;
        double worst = 0;
        for (size_t i = 0; i < whole.size(); ++i) {
          ASSERT_TRUE(split[i]->error.ok()) << split[i]->error;
          ASSERT_EQ(split[i]->tokens.size(), whole[i]->tokens.size());
          total += whole[i]->tokens.size();
          for (size_t t = 0; t < whole[i]->tokens.size(); ++t) {
            // Up to a near-tie, where the extra rounding may flip the token (and everything after it differs).
            const auto& top = whole[i]->logprobs[t].top;
            if (top.size() < 2 || top[0].logprob - top[1].logprob < near_tie) break;
            ++compared;
            const double diff = std::abs(split[i]->logprobs[t].logprob - whole[i]->logprobs[t].logprob);
            worst = std::max(worst, diff);
            EXPECT_LE(diff, kLogprobTolerance) << "request " << i << " position " << t;
            if (split[i]->tokens[t] != whole[i]->tokens[t]) {
              const auto& split_top = split[i]->logprobs[t].top;
              const bool swapped = split_top.size() >= 2 && split_top[1].token_id == whole[i]->tokens[t] &&
                                   top[1].token_id == split[i]->tokens[t] &&
                                   std::abs(split_top[1].logprob - top[0].logprob) <= kLogprobTolerance &&
                                   std::abs(top[1].logprob - split_top[0].logprob) <= kLogprobTolerance;
              if (swapped) {
                ++rounding_flips;
              } else {
                ADD_FAILURE() << "request " << i << " position " << t << ": token " << split[i]->tokens[t]
                              << ", the whole model's " << whole[i]->tokens[t] << " (top-2 margin "
                              << top[0].logprob - top[1].logprob << ")";
              }
              break;
            }
          }
        }
        std::printf(
            "[ parity   ] %s on %d ranks sharing the GPU: %zu of %zu positions compared up to near-ties "
            "(margin %.2f), worst chosen-logprob difference from the whole model %.4f, %zu top-2 pairs swapped by "
            "rounding past the margin\n",
            m, n, compared, total, near_tie, worst, rounding_flips);
        EXPECT_GT(compared, total / 3) << "positions are compared, not all skipped as near-ties";
      }
    }
  }
}

TEST(TensorParallelOnCuda, MoreRanksThanGpusIsRefusedNamingTheField) {
  if (!GpuModels()) GTEST_SKIP() << "INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)";
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus >= 8) GTEST_SKIP() << gpus << " GPUs: every size fits";
  Config config;
  config.model.path = std::string(GpuModels()) + "/llama-hd256-g8-sharp";  // splits 2, 4 and 8 ways
  config.engine.backend = "cuda";
  config.engine.tensor_parallel_size = gpus >= 4 ? 8 : (gpus >= 2 ? 4 : 2);
  auto engine = Engine::Create(config);
  ASSERT_FALSE(engine.ok());
  const std::string message(engine.status().message());
  EXPECT_NE(message.find("engine.tensor_parallel_size = " + std::to_string(config.engine.tensor_parallel_size)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("visible"), std::string::npos) << message;
}

}  // namespace
}  // namespace inferd

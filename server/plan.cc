#include "server/plan.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "engine/model/head_padding.h"
#include "engine/model/model.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runtime/device_layout.h"
#include "engine/runtime/gpu_specs.h"
#include "engine/runtime/step_cost.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

constexpr double kMiB = 1048576.0;
// What the CUDA context and libraries take beyond the step inputs and the reserved block (the H100's start-up
// measured 4.8 MiB of it for the Llama-3-8B shape).
constexpr int64_t kContextBytes = int64_t{5} << 20;
// A GPU planned by name (--device): what is free at start-up is its memory less what the driver and a CUDA context
// hold before inferd allocates (~0.5 GiB on an H100).
constexpr int64_t kDriverBytes = int64_t{512} << 20;
constexpr const char* kUsage =
    "usage: inferd plan --config FILE [--gpu-memory-gib N | --device NAME] [--tensor-parallel N] [--json]\n";

}  // namespace

int RunPlan(int argc, char** argv) {
  std::string config_path;
  double gib = 0;
  bool json = false;
  int32_t tp = 0;  // 0: the config's engine.tensor_parallel_size
  const GpuSpec* device = nullptr;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--tensor-parallel" && i + 1 < argc) {
      tp = std::atoi(argv[++i]);
      if (tp != 1 && tp != 2 && tp != 4 && tp != 8) {
        std::cerr << "inferd plan: --tensor-parallel must be 1, 2, 4 or 8\n";
        return 2;
      }
    } else if (a == "--gpu-memory-gib" && i + 1 < argc) {
      gib = std::atof(argv[++i]);
      if (!(gib > 0)) {
        std::cerr << "inferd plan: --gpu-memory-gib must be a positive number of GiB\n";
        return 2;
      }
    } else if (a == "--device" && i + 1 < argc) {
      const std::string name = argv[++i];
      device = FindGpu(name);
      if (!device) {
        std::cerr << "inferd plan: --device '" << name.substr(0, 40) << "' is not known; allowed: " << KnownGpuNames()
                  << "\n";
        return 2;
      }
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  if (config_path.empty() || (device && gib > 0)) {
    std::cerr << kUsage;
    return 2;
  }
  if (device) gib = (device->memory_gib * (int64_t{1} << 30) - kDriverBytes) / double(int64_t{1} << 30);
  auto config = LoadConfigFile(config_path);
  if (!config.ok()) {
    std::cerr << "inferd plan: " << config.status().message() << "\n";
    return 2;
  }
  const int64_t free = gib > 0 ? static_cast<int64_t>(gib * (int64_t{1} << 30)) : VisibleGpuFreeBytes();
  if (free <= 0) {
    std::cerr << "inferd plan: no GPU is visible; give its free memory with --gpu-memory-gib N\n";
    return 2;
  }
  auto model = LoadModel(config->model.path, {.random_weights = config->model.load_format == "dummy"});
  if (!model.ok()) {
    std::cerr << "inferd plan: " << model.status().message() << "\n";
    return 1;
  }
  // The model as the cuda backend runs it: heads padded where the attention kernels need it.
  auto padded = PaddedForAttentionKernels(**model);
  if (!padded.ok()) {
    std::cerr << "inferd plan: " << padded.status().message() << "\n";
    return 1;
  }
  const Model& m = *padded ? **padded : **model;
  const ModelConfig& c = m.config;
  if (tp == 0) tp = config->engine.tensor_parallel_size;
  if (absl::Status s = CheckTensorParallel(c, tp); !s.ok()) {
    std::cerr << "inferd plan: " << s.message() << "\n";
    return 2;
  }
  const StepLimits limits = StepLimitsFor(*config);
  const int64_t budget = static_cast<int64_t>(free * config->engine.gpu_memory_utilization);
  nlohmann::json out = {{"device_free_bytes", free},
                        {"budget_bytes", budget},
                        {"tensor_parallel_size", tp},
                        {"plans", nlohmann::json::array()}};
  if (!json)
    std::printf(
        "model %s: %s, %d layers, hidden %d, heads %d/%d, head_dim %d%s, vocab %d, max_position_embeddings %d\n",
        m.name.c_str(), c.architecture.c_str(), c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
        (*model)->config.head_dim,
        *padded ? absl::StrFormat(" (run padded to %d: the attention kernels' head dims)", c.head_dim).c_str() : "",
        c.vocab_size, c.max_position_embeddings);
  if (!json)
    std::printf(
        "device memory free %.0f MiB (%s) x gpu_memory_utilization %g = budget %.1f MiB; largest step %d tokens, "
        "%d sequences; block_size %d%s\n",
        free / kMiB,
        device ? absl::StrFormat("%s: %.1f GiB less %lld MiB for the driver", device->full_name, device->memory_gib,
                                 static_cast<long long>(kDriverBytes >> 20))
                     .c_str()
        : gib > 0 ? "--gpu-memory-gib"
                  : "measured on the visible GPU",
        config->engine.gpu_memory_utilization, budget / kMiB, limits.max_num_batched_tokens, limits.max_num_seqs,
        limits.block_size,
        tp > 1 ? absl::StrFormat("; each of %d GPUs (tensor parallelism: the sizes below are per GPU)", tp).c_str()
               : "");
  if (!json)
    std::printf("%-9s %12s %12s %10s %12s %12s %10s %12s  %s\n", "dtype", "weights MiB", "activ. MiB", "other MiB",
                "KV B/token", "KV KiB/blk", "blocks", "KV tokens", "sequences at context 1024 / 4096 / 8192 / max");
  // The layouts the cuda backend allocates from: bf16 and fp16 both take 2 bytes an element; "fp8" is
  // engine.quantization = fp8 (its linear weights one byte an element and a scale per row), the only way an FP8
  // checkpoint runs; "+kv8" adds engine.kv_cache_dtype = fp8_e4m3 (one byte a K or V element), where the model's
  // head_dim allows it.
  // What a layout leaves no room for, and the KV blocks that fit in the rest of the budget.
  const auto used_bytes = [](const DeviceLayout& l) {
    return l.weight_bytes + l.activation_bytes() + l.step_input_bytes() + l.collective_bytes() + kContextBytes;
  };
  const auto blocks_in_budget = [&](const DeviceLayout& l) {
    return std::max<int64_t>(0, (budget - used_bytes(l)) / l.kv_bytes_per_block);
  };
  struct Row {
    const char* name;
    bool fp8_weights, fp8_kv;
  };
  const bool kv8 = c.head_dim == 128 || c.head_dim == 256;
  for (const Row& row : {Row{"bfloat16", false, false}, Row{"float16", false, false}, Row{"fp8", true, false},
                         Row{"bf16+kv8", false, true}, Row{"fp8+kv8", true, true}}) {
    const char* dtype = row.name;
    if (m.tensors.fp8_checkpoint && !row.fp8_weights) continue;
    if (row.fp8_kv && !kv8) continue;
    if (device && device->fp8_tflops == 0 && row.fp8_weights) {  // no fp8 tensor cores: the backend refuses fp8
      if (!json)
        std::printf("%-9s %s (compute capability %d.%d) has no fp8 tensor cores\n", dtype, device->name,
                    device->compute_capability / 10, device->compute_capability % 10);
      continue;
    }
    const DeviceLayout layout = PlanDeviceLayout(m, limits, 2, row.fp8_weights, row.fp8_kv ? 1 : 2, tp);
    const int64_t weights = layout.weight_bytes;
    const int64_t act = layout.activation_bytes();
    const int64_t other = layout.step_input_bytes() + layout.collective_bytes() + kContextBytes;
    const int64_t per_block = layout.kv_bytes_per_block;
    const int64_t blocks = blocks_in_budget(layout);
    // A block holds KvGroups::slots layers of one KV group: a sequence takes blocks in every group, a window group's
    // no more than its window and a step's tokens need. KV tokens: the longest one sequence that fits.
    const KvGroups& groups = layout.kv_groups;
    const auto seq_blocks = [&](int64_t ctx) {
      return groups.MaxBlocks(ctx, limits.block_size, limits.max_num_batched_tokens);
    };
    const int64_t tokens = groups.MaxTokens(blocks, limits.block_size, limits.max_num_batched_tokens, int64_t{1} << 40);
    auto seqs = [&](int64_t ctx) { return blocks / seq_blocks(ctx); };
    out["plans"].push_back({{"dtype", dtype},
                            {"kv_cache_dtype", row.fp8_kv ? "fp8_e4m3" : "auto"},
                            {"weight_bytes", weights},
                            {"activation_bytes", act},
                            {"other_bytes", other},
                            {"kv_bytes_per_block", per_block},
                            {"num_blocks", blocks},
                            {"kv_tokens", tokens},
                            {"sequences_at_4096", seqs(4096)}});
    if (json) continue;
    std::printf("%-9s %12.1f %12.1f %10.1f %12lld %12.1f %10lld %12lld  %lld / %lld / %lld / %lld (at %d)\n", dtype,
                weights / kMiB, act / kMiB, other / kMiB,
                static_cast<long long>(per_block * groups.num_groups() / limits.block_size), per_block / 1024.0,
                static_cast<long long>(blocks), static_cast<long long>(tokens), static_cast<long long>(seqs(1024)),
                static_cast<long long>(seqs(4096)), static_cast<long long>(seqs(8192)),
                static_cast<long long>(seqs(c.max_position_embeddings)), c.max_position_embeddings);
    if (blocks == 0) {
      std::printf("  no KV block fits: weights, activations and other take %.1f MiB of the %.1f MiB budget\n",
                  (weights + act + other) / kMiB, budget / kMiB);
    }
  }
  // Which tensor-parallel sizes fit the model on GPUs like this one: bf16 (or the checkpoint's fp8) weights, and a
  // KV pool per GPU that holds at least one sequence at the longest context.
  const int64_t context = config->model.max_model_len > 0 ? config->model.max_model_len : c.max_position_embeddings;
  const bool fp8 = m.tensors.fp8_checkpoint;
  if (!json)
    std::printf("\ntensor_parallel_size (%s, one sequence of %lld tokens at least):\n", fp8 ? "fp8" : "bfloat16",
                static_cast<long long>(context));
  out["tensor_parallel_fits"] = nlohmann::json::array();
  for (int32_t n : {1, 2, 4, 8}) {
    if (!CheckTensorParallel(c, n).ok()) {
      if (!json) std::printf("  %d: does not split this model\n", n);
      continue;
    }
    const DeviceLayout layout = PlanDeviceLayout(m, limits, 2, fp8, 2, n);
    const int64_t used = used_bytes(layout);
    const int64_t blocks = blocks_in_budget(layout);
    const int64_t kv_tokens =
        layout.kv_groups.MaxTokens(blocks, limits.block_size, limits.max_num_batched_tokens, int64_t{1} << 40);
    const bool fits = kv_tokens >= context;
    out["tensor_parallel_fits"].push_back(
        {{"tensor_parallel_size", n}, {"weight_bytes", layout.weight_bytes}, {"num_blocks", blocks}, {"fits", fits}});
    if (json) continue;
    std::printf("  %d: weights %.1f GiB a GPU, %lld KV tokens a GPU: %s\n", n, layout.weight_bytes / (kMiB * 1024),
                static_cast<long long>(kv_tokens),
                fits ? "fits"
                     : (used > budget ? "does not fit (weights and workspace exceed the budget)"
                                      : "does not fit (too few KV blocks for one sequence)"));
  }
  if (device) {  // what the datasheet allows this model on that GPU, before any kernel's efficiency
    MemoryPlan plan;
    const DeviceLayout bf16 = PlanDeviceLayout(m, limits, 2, fp8, 2, tp);
    plan.weight_bytes = bf16.weight_bytes;
    plan.fp8_weights = fp8;
    plan.kv_bytes_per_block = bf16.kv_bytes_per_block;
    const StepCostModel cost((*model)->config, plan, limits.block_size, tp);  // useful FLOPs, bytes moved
    const double decode_bytes = cost.OfUniform(1, 1, 1024, 1).bytes;
    const double decode_s = decode_bytes / (device->bandwidth_gb_s * 1e9);
    const double prefill_s = cost.OfUniform(1, 4096, 4096, 1).flops / (device->bf16_tflops * 1e12);
    out["device"] = {{"name", device->name},
                     {"bandwidth_bytes_per_s", device->bandwidth_gb_s * 1e9},
                     {"bf16_flops_per_s", device->bf16_tflops * 1e12},
                     {"fp8_flops_per_s", device->fp8_tflops * 1e12},
                     {"decode_batch1_tokens_per_s_ceiling", 1 / decode_s},
                     {"prefill_4096_tokens_per_s_ceiling", 4096 / prefill_s}};
    if (!json) {
      std::printf(
          "\n%s, datasheet ceilings for this model (%s weights, each GPU its share): decode at batch 1 "
          "(context 1024) at most %.0f tokens/s (%.2f GB read a token at %.0f GB/s); a 4096-token prefill at "
          "most %.0f tokens/s (%.0f TFLOP/s bf16). inferd reaches ~80%% and ~60%% of an H100 SXM's.\n",
          device->full_name, fp8 ? "fp8" : "bf16", 1 / decode_s, decode_bytes / 1e9, device->bandwidth_gb_s,
          4096 / prefill_s, device->bf16_tflops);
    }
  }
  if (json) std::cout << out.dump(1) << "\n";
  return 0;
}

}  // namespace inferd

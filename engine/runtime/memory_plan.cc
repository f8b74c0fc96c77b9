#include "engine/runtime/memory_plan.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/status_macros.h"

namespace inferd {
namespace {

constexpr double kMiB = 1048576.0;
constexpr int64_t kMaxBlocks = 1 << 24;

int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

}  // namespace

std::string MemoryPlan::ToString() const {
  std::string s = absl::StrFormat("%s: ", device);
  if (device_total_bytes > 0) {
    absl::StrAppendFormat(&s, "device %.0f MiB, free at start %.0f MiB, ", device_total_bytes / kMiB,
                          device_free_bytes / kMiB);
  }
  absl::StrAppendFormat(
      &s,
      "budget %.1f MiB = weights %.1f MiB + activations %.1f MiB + other %.1f MiB + KV %d blocks x %.1f KiB "
      "(%.1f MiB%s)",
      budget_bytes / kMiB, weight_bytes / kMiB, activation_bytes / kMiB, other_bytes / kMiB, num_blocks,
      kv_bytes_per_block / 1024.0, kv_bytes() / kMiB, kv_dtype.empty() ? "" : ", " + kv_dtype);
  return s;
}

// Host swap space and the host tier of the prefix cache in blocks, refused when host memory (beside `host_taken`
// bytes) cannot hold them.
absl::Status SizeHostBlocks(const EngineSection& engine, int64_t host_taken, MemoryPlan* plan) {
  const auto blocks = [&](const char* key, double gib, int32_t* out) -> absl::Status {
    const int64_t bytes = static_cast<int64_t>(gib * (1ll << 30));
    *out = static_cast<int32_t>(std::min<int64_t>(bytes / plan->kv_bytes_per_block, kMaxBlocks));
    if (gib > 0 && *out < 1) {
      return absl::InvalidArgumentError(absl::StrCat("config: engine.", key, " = ", gib, " holds no KV block of ",
                                                     plan->kv_bytes_per_block, " bytes"));
    }
    return absl::OkStatus();
  };
  INFERD_RETURN_IF_ERROR(blocks("swap_space_gib", engine.swap_space_gib, &plan->num_swap_blocks));
  INFERD_RETURN_IF_ERROR(blocks("host_kv_cache_gib", engine.host_kv_cache_gib, &plan->num_host_cache_blocks));
  const int64_t host = HostMemoryBytes();
  const int64_t asked = int64_t{plan->num_host_blocks()} * plan->kv_bytes_per_block;
  if (host > 0 && host_taken + asked > host) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "config: engine.swap_space_gib = %g and engine.host_kv_cache_gib = %g ask for %.1f MiB of host memory beside "
        "%.1f MiB already taken; this machine has %.1f MiB",
        engine.swap_space_gib, engine.host_kv_cache_gib, asked / kMiB, host_taken / kMiB, host / kMiB));
  }
  return absl::OkStatus();
}

absl::Status SizeKvPool(const EngineSection& engine, MemoryPlan* plan) {
  const int64_t taken = plan->weight_bytes + plan->activation_bytes + plan->other_bytes;
  if (plan->device_total_bytes > 0) {
    plan->budget_bytes = static_cast<int64_t>(plan->device_free_bytes * engine.gpu_memory_utilization);
    const int64_t kv_budget = plan->budget_bytes - taken;
    const int64_t fits = std::max<int64_t>(0, kv_budget / plan->kv_bytes_per_block);
    if (engine.num_blocks > 0) {
      if (engine.num_blocks > fits) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "config: engine.num_blocks = %d needs %.1f MiB of KV cache but engine.gpu_memory_utilization = %g leaves "
            "%.1f MiB after weights (%.1f MiB), activations (%.1f MiB) and other (%.1f MiB); at most %d blocks fit",
            engine.num_blocks, engine.num_blocks * static_cast<double>(plan->kv_bytes_per_block) / kMiB,
            engine.gpu_memory_utilization, std::max<int64_t>(0, kv_budget) / kMiB, plan->weight_bytes / kMiB,
            plan->activation_bytes / kMiB, plan->other_bytes / kMiB, fits));
      }
      plan->num_blocks = engine.num_blocks;
    } else {
      plan->num_blocks = static_cast<int32_t>(std::min(fits, kMaxBlocks));
    }
    if (plan->num_blocks < 1) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "config: no KV block fits: engine.gpu_memory_utilization = %g of %.1f MiB free gives %.1f MiB, and weights "
          "(%.1f MiB), activations (%.1f MiB) and other (%.1f MiB) take %.1f MiB; raise it or lower "
          "scheduler.max_num_batched_tokens",
          engine.gpu_memory_utilization, plan->device_free_bytes / kMiB, plan->budget_bytes / kMiB,
          plan->weight_bytes / kMiB, plan->activation_bytes / kMiB, plan->other_bytes / kMiB, taken / kMiB));
    }
    return SizeHostBlocks(engine, 0, plan);
  }
  const int64_t kv_budget = static_cast<int64_t>(engine.cpu_kv_cache_gib * (1ll << 30));
  plan->num_blocks = engine.num_blocks > 0
                         ? engine.num_blocks
                         : static_cast<int32_t>(std::min<int64_t>(kv_budget / plan->kv_bytes_per_block, kMaxBlocks));
  if (plan->num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("config: engine.cpu_kv_cache_gib = ", engine.cpu_kv_cache_gib,
                                                   " holds no KV block of ", plan->kv_bytes_per_block, " bytes"));
  }
  // Checked before anything is allocated: a pool larger than the machine would only fail later, and badly.
  const int64_t host = HostMemoryBytes();
  if (host > 0 && taken + plan->kv_bytes() > host) {
    const std::string setting = engine.num_blocks > 0
                                    ? absl::StrCat("engine.num_blocks = ", engine.num_blocks)
                                    : absl::StrCat("engine.cpu_kv_cache_gib = ", engine.cpu_kv_cache_gib);
    return absl::InvalidArgumentError(absl::StrFormat(
        "config: %s asks for a %.1f MiB KV cache, which with weights and activations (%.1f MiB) exceeds this "
        "machine's %.1f MiB of memory; allowed: at most %d blocks of %.1f KiB",
        setting, plan->kv_bytes() / kMiB, taken / kMiB, host / kMiB,
        static_cast<int>(std::max<int64_t>(0, (host - taken) / plan->kv_bytes_per_block)),
        plan->kv_bytes_per_block / 1024.0));
  }
  plan->budget_bytes = taken + plan->kv_bytes();
  return SizeHostBlocks(engine, plan->budget_bytes, plan);
}

}  // namespace inferd

// Sizing the KV pool from what the backend measured.
#include "engine/runtime/memory_plan.h"

#include <gtest/gtest.h>

namespace inferd {
namespace {

constexpr int64_t kMiB = 1 << 20;

MemoryPlan Measured() {
  MemoryPlan p;
  p.device = "test GPU";
  p.device_total_bytes = 1000 * kMiB;
  p.device_free_bytes = 800 * kMiB;
  p.weight_bytes = 300 * kMiB;
  p.activation_bytes = 50 * kMiB;
  p.other_bytes = 10 * kMiB;
  p.kv_bytes_per_block = 2 * kMiB;
  return p;
}

TEST(MemoryPlan, DeviceKvGetsFreeTimesUtilizationMinusWhatIsTaken) {
  MemoryPlan p = Measured();
  EngineSection e;
  e.gpu_memory_utilization = 0.5;  // 400 MiB, of which 360 are taken: 40 MiB = 20 blocks
  ASSERT_TRUE(SizeKvPool(e, &p).ok());
  EXPECT_EQ(p.budget_bytes, 400 * kMiB);
  EXPECT_EQ(p.num_blocks, 20);
  EXPECT_LE(p.weight_bytes + p.activation_bytes + p.other_bytes + p.kv_bytes(), p.budget_bytes);
  EXPECT_NE(p.ToString().find("20 blocks"), std::string::npos) << p.ToString();
}

TEST(MemoryPlan, DeviceRefusesWhenNothingFitsOrTooManyBlocksAreAsked) {
  MemoryPlan p = Measured();
  EngineSection e;
  e.gpu_memory_utilization = 0.4;  // 320 MiB < 360 taken
  absl::Status s = SizeKvPool(e, &p);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("gpu_memory_utilization"), std::string::npos) << s;

  p = Measured();
  e.gpu_memory_utilization = 0.5;
  e.num_blocks = 21;
  s = SizeKvPool(e, &p);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("engine.num_blocks = 21"), std::string::npos) << s;
  EXPECT_NE(s.message().find("at most 20 blocks"), std::string::npos) << s;
  e.num_blocks = 20;
  EXPECT_TRUE(SizeKvPool(e, &p).ok());
  EXPECT_EQ(p.num_blocks, 20);
}

TEST(MemoryPlan, CpuKvComesFromItsOwnSetting) {
  MemoryPlan p;
  p.device = "cpu";
  p.weight_bytes = 7;
  p.activation_bytes = 5;
  p.kv_bytes_per_block = 1 * kMiB;
  EngineSection e;
  e.cpu_kv_cache_gib = 0.25;
  ASSERT_TRUE(SizeKvPool(e, &p).ok());
  EXPECT_EQ(p.num_blocks, 256);
  EXPECT_EQ(p.budget_bytes, 12 + 256 * kMiB);
  e.cpu_kv_cache_gib = 0.0001;
  EXPECT_EQ(SizeKvPool(e, &p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryPlan, CpuRefusesMoreThanTheMachineHasBeforeAllocating) {
  MemoryPlan p;
  p.device = "cpu";
  p.kv_bytes_per_block = 8 * kMiB;
  EngineSection e;
  e.num_blocks = 1 << 24;  // 128 TiB
  absl::Status s = SizeKvPool(e, &p);
  EXPECT_TRUE(IsConfigError(s)) << s;
  EXPECT_NE(s.message().find("engine.num_blocks = 16777216"), std::string::npos) << s;
  EXPECT_NE(s.message().find("exceeds this machine's"), std::string::npos) << s;
  e.num_blocks = 0;
  e.cpu_kv_cache_gib = 1024;
  s = SizeKvPool(e, &p);
  EXPECT_NE(s.message().find("engine.cpu_kv_cache_gib = 1024"), std::string::npos) << s;
}

}  // namespace
}  // namespace inferd

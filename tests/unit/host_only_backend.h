// The parts of a test backend that have no device behind them: a memory plan of small blocks named `device`, a KV
// pool and host blocks that need nothing, copies done as soon as they start. Test fakes derive from it and write
// their steps.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "engine/runtime/backend.h"

namespace inferd::testing {

class HostOnlyBackend : public Backend {
 public:
  explicit HostOnlyBackend(std::string device) : device_(std::move(device)) {}
  std::string name() const override { return device_; }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits&) override {
    MemoryPlan p;
    p.device = device_;
    p.kv_bytes_per_block = 1024;
    return p;
  }
  absl::Status AllocateKvCache(const MemoryPlan&) override { return absl::OkStatus(); }
  absl::Status AllocateHostBlocks(int32_t) override { return absl::OkStatus(); }
  absl::Status StartCopies(const CopyBatch& batch) override {
    completed_copies_ = batch.ticket;
    return absl::OkStatus();
  }
  uint64_t CompletedCopies() override { return completed_copies_; }
  absl::Status WaitForCopies(uint64_t) override { return absl::OkStatus(); }

 private:
  std::string device_;
  uint64_t completed_copies_ = 0;
};

}  // namespace inferd::testing

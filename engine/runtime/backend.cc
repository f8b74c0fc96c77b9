#include "engine/runtime/backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace inferd {

absl::Status Backend::Launch(const StepInput& input) {
  if (launched_.size() + deferred_.has_value() >= 2) {
    return absl::FailedPreconditionError("two steps are launched and not collected");
  }
  if (deferred_) return absl::FailedPreconditionError("a step waits for its masks (SupplyMasks)");
  if (std::any_of(input.sampling.begin(), input.sampling.end(), [](const SamplingRow& r) { return r.allowed_later; })) {
    Deferred& d = deferred_.emplace();
    d.input = input;
    for (SamplingRow& row : d.input.sampling) {
      row.tokens = d.tokens.emplace_back(row.tokens.begin(), row.tokens.end());
      row.banned = d.banned.emplace_back(row.banned.begin(), row.banned.end());
      row.allowed = d.allowed.emplace_back(row.allowed.begin(), row.allowed.end());
    }
    return absl::OkStatus();
  }
  Run(input);
  return absl::OkStatus();
}

absl::Status Backend::SupplyMasks(std::span<const std::span<const uint32_t>> masks) {
  if (!deferred_) return absl::FailedPreconditionError("no launched step waits for masks");
  Deferred d = std::move(*deferred_);
  deferred_.reset();
  size_t next = 0;
  for (SamplingRow& row : d.input.sampling) {
    if (!row.allowed_later) continue;
    if (next == masks.size()) return absl::InvalidArgumentError("fewer masks than rows that wait for one");
    row.allowed = masks[next++];
    row.allowed_later = false;
  }
  if (next != masks.size()) return absl::InvalidArgumentError("more masks than rows that wait for one");
  Run(d.input);
  return absl::OkStatus();
}

void Backend::Run(const StepInput& input) {
  bool pending = false;
  for (int32_t id : input.token_ids) pending |= IsPendingToken(id);
  StepInput resolved;
  if (pending) {
    resolved = input;
    for (int32_t& id : resolved.token_ids) {
      if (!IsPendingToken(id)) continue;
      const int32_t row = PendingRow(id);
      if (row >= static_cast<int32_t>(last_sampled_.size())) {  // it failed, or sampled fewer rows
        launched_.push_back({absl::FailedPreconditionError(absl::StrCat("a step reads the token of row ", row,
                                                                        " of the step before it, which sampled ",
                                                                        last_sampled_.size(), " rows")),
                             {}});
        last_sampled_.clear();
        return;
      }
      id = last_sampled_[row];
    }
  }
  Launched& step = launched_.emplace_back();
  step.status = Step(pending ? resolved : input, &step.output);
  last_sampled_ = step.status.ok() ? step.output.tokens : std::vector<int32_t>{};
}

absl::Status Backend::Collect(StepOutput* output) {
  if (launched_.empty()) {
    return absl::FailedPreconditionError(deferred_ ? "the step to collect waits for its masks (SupplyMasks)"
                                                   : "no step was launched");
  }
  Launched step = std::move(launched_.front());
  launched_.pop_front();
  if (step.status.ok()) *output = std::move(step.output);
  return step.status;
}

}  // namespace inferd

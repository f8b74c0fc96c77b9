#include "engine/runtime/backend.h"

#include "absl/strings/str_cat.h"

namespace inferd {

absl::Status Backend::Launch(const StepInput& input) {
  if (launched_.size() >= 2) return absl::FailedPreconditionError("two steps are launched and not collected");
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
        return absl::OkStatus();
      }
      id = last_sampled_[row];
    }
  }
  Launched& step = launched_.emplace_back();
  step.status = Step(pending ? resolved : input, &step.output);
  last_sampled_ = step.status.ok() ? step.output.tokens : std::vector<int32_t>{};
  return absl::OkStatus();
}

absl::Status Backend::Collect(StepOutput* output) {
  if (launched_.empty()) return absl::FailedPreconditionError("no step was launched");
  Launched step = std::move(launched_.front());
  launched_.pop_front();
  if (step.status.ok()) *output = std::move(step.output);
  return step.status;
}

}  // namespace inferd

#include "engine/spec/draft_budget.h"

#include <algorithm>
#include <cmath>

#include "engine/check.h"

namespace inferd {

DraftBudget::DraftBudget(int32_t max_tokens, double min_reach, int32_t probe_every, double decay)
    : max_tokens_(max_tokens), min_reach_(min_reach), probe_every_(probe_every), decay_(decay) {
  INFERD_CHECK(max_tokens >= 0 && min_reach > 0 && min_reach < 1 && probe_every >= 1 && decay > 0 && decay <= 1,
               "a draft budget's limits are in range");
}

double DraftBudget::acceptance() const {
  return kept_ / (kept_ + rejected_);
}

int32_t DraftBudget::Next() {
  const double alpha = acceptance();
  // The largest k with α^k ≥ min_reach (every k when nothing was rejected).
  int32_t k = max_tokens_;
  if (alpha < 1)
    k = static_cast<int32_t>(std::min<double>(max_tokens_, std::floor(std::log(min_reach_) / std::log(alpha))));
  if (k >= 1) {
    idle_steps_ = 0;
    return k;
  }
  if (++idle_steps_ >= probe_every_ && max_tokens_ > 0) {
    idle_steps_ = 0;
    return 1;  // a probe
  }
  return 0;
}

void DraftBudget::Record(int32_t drafted, int32_t accepted) {
  INFERD_CHECK(drafted >= 0 && accepted >= 0 && accepted <= drafted, "a step keeps at most the tokens it drafted");
  if (drafted == 0) return;
  kept_ = decay_ * kept_ + accepted;
  rejected_ = decay_ * rejected_ + (accepted < drafted ? 1 : 0);
}

}  // namespace inferd

#include "engine/spec/draft_payoff.h"

#include <bit>

#include "engine/check.h"

namespace inferd {

DraftPayoff::DraftPayoff(int32_t probe_every, double decay) : probe_every_(probe_every), decay_(decay) {
  INFERD_CHECK(probe_every >= 1 && decay > 0 && decay < 1, "a draft payoff probes and decays within range");
}

void DraftPayoff::Record(int32_t n, int32_t drafted, int32_t accepted, double seconds) {
  INFERD_CHECK(n >= 1 && drafted >= 0 && accepted >= 0 && accepted <= drafted, "a step's drafts are counted");
  Class& c = classes_[std::bit_width(static_cast<uint32_t>(n))];
  const auto mean = [&](double& m, int32_t& steps, double x) {
    m = steps == 0 ? x : decay_ * m + (1 - decay_) * x;
    ++steps;
  };
  if (drafted == 0) {
    mean(c.plain_s, c.plain_steps, seconds);
  } else {
    const double gained = static_cast<double>(accepted) / n;  // tokens a sequence got beyond its one
    c.gained = c.verify_steps == 0 ? gained : decay_ * c.gained + (1 - decay_) * gained;
    mean(c.verify_s, c.verify_steps, seconds);
  }
}

bool DraftPayoff::ShouldDraft(int32_t n) {
  Class& c = classes_[std::bit_width(static_cast<uint32_t>(n))];
  if (c.verify_steps < kFirstSteps) return true;
  if (c.plain_steps < kFirstSteps) return false;
  // Time per generated token each way, at one batch size (a sequence gets 1 token a plain step, 1 + gained a
  // verifying one).
  const bool pays = c.verify_s / (1 + c.gained) < c.plain_s;
  if (++c.since_other >= probe_every_) {
    c.since_other = 0;
    return !pays;  // the other side, measured again
  }
  return pays;
}

}  // namespace inferd

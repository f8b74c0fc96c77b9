// How many drafted tokens a sequence's next step checks, from how its drafts have fared. Each drafted token is kept
// with some probability α while the ones before it were (the acceptance rule keeps a prefix), so the k-th token of a
// draft is kept with α^k: drafting past the k where α^k falls under `min_reach` costs verification rows that are
// rarely kept. α is estimated from the sequence's own steps (kept tokens over kept tokens plus rejections, each
// step counted with weight `decay` against the last); at α^1 < min_reach the sequence stops drafting, and tries one
// token again every `probe_every` steps, so a sequence that starts repeating itself later gets drafts again.
#pragma once

#include <cstdint>

namespace inferd {

class DraftBudget {
 public:
  DraftBudget(int32_t max_tokens, double min_reach = 0.2, int32_t probe_every = 16, double decay = 0.9);
  // Tokens to draft for the next step (0: none), at most what a source may offer.
  int32_t Next();
  // A step's outcome: `drafted` tokens checked, `accepted` of them kept (all of them, or a prefix and a rejection).
  void Record(int32_t drafted, int32_t accepted);
  double acceptance() const;

 private:
  int32_t max_tokens_;
  double min_reach_;
  int32_t probe_every_;
  double decay_;
  double kept_ = 1, rejected_ = 0;  // decayed counts; a new sequence starts trusting its drafts
  int32_t idle_steps_ = 0;          // steps since it last drafted
};

}  // namespace inferd

// Whether checking drafts pays at a batch size, from the steps' own times. A step that checks drafts costs more than
// a plain one (more rows), and pays back in the drafted tokens it keeps. Per batch-size class (1, 2-3, 4-7, ...)
// the wall time of plain decode steps and of verifying ones, and the tokens a verifying step gains a sequence over
// its one, are averaged (decayed); the next step drafts while a token comes faster that way: verify_s / (1 +
// gained) < plain_s. Either side is measured first (a few steps each), and the side not taken is tried again every
// `probe_every` steps, so the choice follows the load and the text.
// Times are a step's, not a sequence's: where drafting can pay, a step's time is its weights' read (or its
// launches'), nearly the same at any batch size of a class, while a batch that shrinks as requests end would make
// the side measured last look dearer per sequence (measured at 17 sequences against the other side's 31: 1.8×)
// and so pick the other.
#pragma once

#include <cstdint>
#include <map>

namespace inferd {

class DraftPayoff {
 public:
  explicit DraftPayoff(int32_t probe_every = 64, double decay = 0.8);
  // A decode step of n sequences took `seconds`, checking `drafted` drafted tokens of which `accepted` were kept.
  void Record(int32_t n, int32_t drafted, int32_t accepted, double seconds);
  // Whether the next decode step of n sequences should draft.
  bool ShouldDraft(int32_t n);

 private:
  struct Class {
    double plain_s = 0, verify_s = 0, gained = 0;  // decayed means
    int32_t plain_steps = 0, verify_steps = 0;
    int32_t since_other = 0;  // steps since the side not chosen was last tried
  };
  static constexpr int32_t kFirstSteps = 3;  // measured on each side before choosing
  int32_t probe_every_;
  double decay_;
  std::map<int32_t, Class> classes_;  // by the bit width of n
};

}  // namespace inferd

// Checking a sequence's drafted tokens against the target model's rows in one step, exactly: the tokens kept are
// distributed as sampling without drafts would give them (the rows' distributions are the sampler chain's, after
// penalties, bias, constraints, temperature and top-k/p/min-p: runtime/sampler.h's Candidates).
// n-gram and suffix drafts are tokens, not distributions (q = 1 on the drafted token), so the rejection rule reduces
// to: drafted token d_i is kept with probability p_i(d_i); at the first one rejected, the token is drawn from p_i
// without d_i (max(p_i − q_i, 0) renormalised); with every draft kept, one more token from the last row. One uniform
// number a row does both: u < p(d) keeps d, and on rejection (u − p(d)) / (1 − p(d)), uniform again, draws the
// replacement, so a seeded request's tokens depend on its seed and positions alone, as without drafts. Greedy rows
// (their argmax alone) keep a draft while it equals the argmax.
#pragma once

#include <cstdint>
#include <span>

#include "engine/runtime/sampler.h"

namespace inferd {

struct Verified {
  int32_t accepted = 0;  // drafted tokens kept
  int32_t next = -1;     // the token after them: the replacement of the first rejected one, or one more
};

// rows: drafts.size() + 1 distributions, row i the one drafts[i] is checked against (row i follows the sequence
// and drafts[0..i)); uniforms: one in [0, 1) a row.
Verified VerifyDrafts(std::span<const Candidates> rows, std::span<const int32_t> drafts,
                      std::span<const double> uniforms);

}  // namespace inferd

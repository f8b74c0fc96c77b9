// Checking a sequence's drafted tokens against the target model's rows in one step, exactly. n-gram and suffix
// drafts are tokens, not distributions (q = 1 on the drafted token), so rejection sampling's rule — keep drafted
// token d_i with probability min(1, p_i(d_i) / q_i(d_i)) = p_i(d_i), and at the first one rejected draw from
// max(p_i − q_i, 0) renormalised, which is p_i without d_i — is the same as sampling every row as a step without
// drafts would (row i follows the sequence and d_0..d_{i-1}, with the uniform number of its position) and keeping
// the drafts while they equal the rows' tokens: the sample equals d_i with probability p_i(d_i), and when it does
// not, it is distributed as p_i without d_i. The first row whose token differs gives the next token; with every
// draft kept, the last row gives one more. So the sampler's chain runs unchanged (penalties, bias, constraints,
// temperature, top-k/p/min-p), greedy rows keep a draft while it is the argmax, and a seeded request produces the
// very tokens it produces without drafts (its uniform numbers depend on its seed and positions alone).
// FlashInfer's chain speculative sampling kernel is for drafts that are distributions (a draft model's q).
#pragma once

#include <cstdint>
#include <span>

namespace inferd {

struct Verified {
  int32_t accepted = 0;  // drafted tokens kept
  int32_t next = -1;     // the token after them: the first row's token that differs from its draft, or one more
};

// sampled: the tokens of drafts.size() + 1 rows, row i checking drafts[i] (the last row follows every draft).
Verified VerifyDrafts(std::span<const int32_t> sampled, std::span<const int32_t> drafts);

}  // namespace inferd

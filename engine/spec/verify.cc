#include "engine/spec/verify.h"

#include "engine/check.h"

namespace inferd {
namespace {

// The drafted token's probability in the row (0 where it is not a candidate).
double ProbabilityOf(const Candidates& row, int32_t token) {
  for (size_t i = 0; i < row.ids.size(); ++i) {
    if (row.ids[i] == token) return row.probs[i] / row.total;
  }
  return 0;
}

// A draw from the row without `token` (Draw over the other candidates).
int32_t DrawWithout(const Candidates& row, int32_t token, double uniform) {
  Candidates rest;
  rest.total = 0;
  for (size_t i = 0; i < row.ids.size(); ++i) {
    if (row.ids[i] == token) continue;
    rest.ids.push_back(row.ids[i]);
    rest.probs.push_back(row.probs[i]);
    rest.total += row.probs[i];
  }
  return Draw(rest, uniform);
}

}  // namespace

Verified VerifyDrafts(std::span<const Candidates> rows, std::span<const int32_t> drafts,
                      std::span<const double> uniforms) {
  INFERD_CHECK(rows.size() == drafts.size() + 1 && uniforms.size() == rows.size(),
               "a row and a uniform number for each drafted token and one more");
  Verified v;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const double p = ProbabilityOf(rows[i], drafts[i]);
    if (uniforms[i] < p) {
      ++v.accepted;
      continue;
    }
    // Rejected: p < 1, and the row has another candidate (p would be 1 otherwise).
    v.next = DrawWithout(rows[i], drafts[i], (uniforms[i] - p) / (1 - p));
    return v;
  }
  v.next = Draw(rows[drafts.size()], uniforms[drafts.size()]);
  return v;
}

}  // namespace inferd

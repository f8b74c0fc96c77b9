#include "engine/spec/verify.h"

#include "engine/check.h"

namespace inferd {

Verified VerifyDrafts(std::span<const int32_t> sampled, std::span<const int32_t> drafts) {
  INFERD_CHECK(sampled.size() == drafts.size() + 1, "a sampled row for each drafted token and one more");
  Verified v;
  while (static_cast<size_t>(v.accepted) < drafts.size() && sampled[v.accepted] == drafts[v.accepted]) ++v.accepted;
  v.next = sampled[v.accepted];
  return v;
}

}  // namespace inferd

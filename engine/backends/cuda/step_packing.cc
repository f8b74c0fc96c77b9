#include "engine/backends/cuda/step_packing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "kernels/sizes.h"

namespace inferd::cuda {
namespace {

template <typename T>
T* At(char* arena, const Region& r) {
  return reinterpret_cast<T*>(arena + r.offset);
}

void Put(char* arena, const Region& r, const std::vector<int32_t>& v) {
  INFERD_CHECK(static_cast<int64_t>(v.size() * sizeof(int32_t)) <= r.bytes, "a step's array fits its input region");
  std::memcpy(arena + r.offset, v.data(), v.size() * sizeof(int32_t));
}

}  // namespace

PackedStep PackStepInputs(const StepInput& in, const InputRegions& layout, int32_t vocab_size, int32_t no_block,
                          char* arena) {
  const int64_t groups = in.num_kv_groups(), pages = in.kv_indptr.back();
  const int64_t slots_stride = layout.slots_stride, indptr_stride = layout.indptr_stride;
  INFERD_CHECK(groups >= 1 && groups * slots_stride * 4 <= layout.slots.bytes &&
                   groups * indptr_stride * 4 <= layout.kv_indptr.bytes,
               "the layout has a row of slots and of kv_indptr per KV group of the step");
  INFERD_CHECK(in.num_tokens() <= slots_stride && in.num_seqs() + 1 <= indptr_stride &&
                   groups * pages * 4 <= layout.kv_indices.bytes,
               "a step's arrays fit their input regions");
  Put(arena, layout.token_ids, in.token_ids);
  Put(arena, layout.positions, in.positions);
  Put(arena, layout.qo_indptr, in.query_start);
  Put(arena, layout.kv_last_page_len, in.kv_last_page_len);
  Put(arena, layout.logits_indices, in.logits_indices);
  for (int64_t g = 0; g < groups; ++g) {
    std::memcpy(At<int32_t>(arena, layout.slots) + g * slots_stride, in.slot_mapping[g].data(),
                in.slot_mapping[g].size() * sizeof(int32_t));
    int32_t* indptr = At<int32_t>(arena, layout.kv_indptr) + g * indptr_stride;
    for (size_t s = 0; s < in.kv_indptr.size(); ++s) indptr[s] = in.kv_indptr[s] + static_cast<int32_t>(g * pages);
    // A page no position of the step attends to (a window group's, let go) points at the backend's own block.
    int32_t* indices = At<int32_t>(arena, layout.kv_indices) + g * pages;
    for (int64_t p = 0; p < pages; ++p) indices[p] = in.kv_indices[g][p] >= 0 ? in.kv_indices[g][p] : no_block;
  }
  const int32_t R = in.num_logits();
  INFERD_CHECK(static_cast<int64_t>(R * sizeof(kernels::SamplingRowParams)) <= layout.params.bytes &&
                   in.sampling.size() == static_cast<size_t>(R),
               "every logits row has its sampling parameters, within the region");
  // Penalty entries: one per distinct id of a row that uses penalties, bans or biases ids, sorted by id.
  std::vector<std::pair<int32_t, int32_t>> seen;  // (id, 1 from the output, 0 the prompt, -1 banned, -2 biased)
  int32_t* indptr = At<int32_t>(arena, layout.penalty_indptr);
  indptr[0] = 0;
  int64_t n = 0, masked_rows = 0;
  bool masks_later = false;
  for (int32_t r = 0; r < R; ++r) {
    const SamplingRow& row = in.sampling[r];
    const SamplingParams& p = row.params;
    At<kernels::SamplingRowParams>(arena, layout.params)[r] = {p.temperature,
                                                               p.top_k,
                                                               p.top_p,
                                                               p.min_p,
                                                               p.repetition_penalty,
                                                               p.presence_penalty,
                                                               p.frequency_penalty,
                                                               std::min(row.top_logprobs, kernels::kMaxTopLogprobs),
                                                               row.target,
                                                               row.uniform,
                                                               row.allowed.empty() && !row.allowed_later ? 0 : 1};
    masks_later |= row.allowed_later;
    if (!row.allowed.empty()) {
      INFERD_CHECK(static_cast<int64_t>(row.allowed.size()) == layout.mask_words &&
                       (r + 1) * layout.mask_words * 4 <= layout.allowed.bytes,
                   "a row's mask covers the vocabulary and fits its region");
      std::memcpy(At<uint32_t>(arena, layout.allowed) + r * layout.mask_words, row.allowed.data(),
                  row.allowed.size() * sizeof(uint32_t));
      masked_rows = r + 1;
    }
    seen.clear();
    if (p.penalized()) {
      for (size_t i = 0; i < row.tokens.size(); ++i) {
        const bool output = static_cast<int32_t>(i) >= row.num_prompt_tokens;
        if (p.repetition_penalty != 1.f || output) seen.emplace_back(row.tokens[i], output ? 1 : 0);
      }
    }
    for (int32_t b : row.banned) seen.emplace_back(b, -1);
    for (const auto& [id, bias] : p.logit_bias) seen.emplace_back(id, -2);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      const int32_t id = seen[i].first;
      int32_t count = 0;
      uint8_t flags = 0;
      float bias = 0.f;
      for (; i < seen.size() && seen[i].first == id; ++i) {
        if (seen[i].second == -1) {
          flags |= kernels::kPenaltyBanned;
        } else if (seen[i].second == -2) {
          flags |= kernels::kPenaltyBias;
          bias = std::lower_bound(p.logit_bias.begin(), p.logit_bias.end(), std::pair{id, -INFINITY})->second;
        } else {
          flags |= kernels::kPenaltySeen;
          count += seen[i].second;
        }
      }
      if (id < 0 || id >= vocab_size) continue;
      INFERD_CHECK(n < layout.max_penalties, "penalty entries fit (sized for every row's context)");
      At<int32_t>(arena, layout.penalty_tokens)[n] = id;
      At<int32_t>(arena, layout.penalty_counts)[n] = count;
      At<float>(arena, layout.penalty_bias)[n] = bias;
      // Without a repetition penalty, the prompt's ids only matter when banned or biased.
      At<uint8_t>(arena, layout.penalty_flags)[n] =
          p.repetition_penalty != 1.f ? flags : (flags & (kernels::kPenaltyBanned | kernels::kPenaltyBias));
      ++n;
    }
    indptr[r + 1] = static_cast<int32_t>(n);
  }
  *At<uint32_t>(arena, layout.masks_ready) = masks_later ? 0 : 1;
  return {layout.kv_indices.offset + groups * pages * static_cast<int64_t>(sizeof(int32_t)), n, masked_rows};
}

}  // namespace inferd::cuda

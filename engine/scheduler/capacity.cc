#include "engine/scheduler/capacity.h"

#include <optional>
#include <span>

namespace inferd {

bool Capacity::Grow(Sequence* seq, int32_t num_tokens, int32_t headroom) {
  const int32_t need = BlocksFor(num_tokens, block_size_) - static_cast<int32_t>(seq->block_table.size());
  if (need <= 0) return true;
  if (!pool_->CanAllocate(need + headroom)) return false;
  const std::vector<int32_t> blocks = pool_->Allocate(need);
  seq->block_table.insert(seq->block_table.end(), blocks.begin(), blocks.end());
  return true;
}

void Capacity::ReusePrefix(Sequence* seq) {
  if (!seq->block_table.empty()) return;
  if (prefix_caching_) {
    const int32_t max_blocks = (seq->num_tokens() - 1) / block_size_;  // the last token is computed: it samples
    uint64_t parent = 0;
    for (int32_t i = 0; i < max_blocks; ++i) {
      const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * block_size_, block_size_);
      const uint64_t key = BlockPool::BlockKey(parent, tokens);
      const std::optional<int32_t> block = pool_->Reuse(key, tokens);
      if (!block) break;
      seq->block_table.push_back(*block);
      seq->block_keys.push_back(key);
      parent = key;
    }
  }
  seq->num_computed = static_cast<int32_t>(seq->block_table.size()) * block_size_;
}

void Capacity::Admitted(Sequence* seq) {
  if (seq->num_preemptions > 0) return;
  seq->num_cached_tokens = seq->num_computed;
  counters_.prefix_query_tokens += seq->num_prompt_tokens;
  counters_.prefix_hit_tokens += seq->num_computed;
}

void Capacity::RememberFullBlocks(Sequence* seq) {
  if (!prefix_caching_) return;
  const int32_t full = seq->num_computed / block_size_;
  for (int32_t i = static_cast<int32_t>(seq->block_keys.size()); i < full; ++i) {
    const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * block_size_, block_size_);
    const uint64_t key = BlockPool::BlockKey(i == 0 ? 0 : seq->block_keys[i - 1], tokens);
    pool_->Remember(seq->block_table[i], key, tokens);
    seq->block_keys.push_back(key);
  }
}

void Capacity::Release(Sequence* seq) {
  pool_->Free(seq->block_table);
  seq->block_table.clear();
  seq->block_keys.clear();
  seq->num_computed = 0;
}

void Capacity::Preempt(Sequence* seq, std::vector<BlockCopy>* swap_out) {
  counters_.preemptions++;
  seq->num_preemptions++;
  seq->tokens_at_preemption = seq->num_tokens();
  const int32_t computed = BlocksFor(seq->num_computed, block_size_);
  if (swap_pool_ && computed > 0 && swap_pool_->CanAllocate(computed)) {
    seq->swapped_blocks = swap_pool_->Allocate(computed);
    for (int32_t i = 0; i < computed; ++i) swap_out->push_back({seq->block_table[i], seq->swapped_blocks[i]});
    counters_.swapped_preemptions++;
    counters_.swapped_blocks += computed;
    const int32_t keep = seq->num_computed;
    Release(seq);
    seq->num_computed = keep;  // its KV waits on the host
    return;
  }
  counters_.preempted_tokens += seq->num_computed;
  Release(seq);
}

bool Capacity::SwapIn(Sequence* seq, int32_t num_tokens, int32_t headroom, std::vector<BlockCopy>* swap_in) {
  const int32_t need = BlocksFor(num_tokens, block_size_);
  const int32_t swapped = static_cast<int32_t>(seq->swapped_blocks.size());
  if (!seq->block_table.empty() || need < swapped || !pool_->CanAllocate(need + headroom)) return false;
  seq->block_table = pool_->Allocate(need);
  for (int32_t i = 0; i < swapped; ++i) swap_in->push_back({seq->block_table[i], seq->swapped_blocks[i]});
  swapped_in_.insert(swapped_in_.end(), seq->swapped_blocks.begin(), seq->swapped_blocks.end());
  seq->swapped_blocks.clear();
  return true;
}

void Capacity::ReleaseSwappedIn() {
  if (swap_pool_) swap_pool_->Free(swapped_in_);
  swapped_in_.clear();
}

void Capacity::Finish(Sequence* seq) {
  if (swap_pool_ && !seq->swapped_blocks.empty()) swap_pool_->Free(seq->swapped_blocks);
  seq->swapped_blocks.clear();
  Release(seq);
}

Sequence* Capacity::ChooseVictim(const std::vector<Sequence*>& candidates, const Sequence* for_seq, int32_t below,
                                 bool spare_awaiting) {
  Sequence* victim = nullptr;
  for (Sequence* s : candidates) {
    if (s == for_seq || (spare_awaiting && s->awaiting_progress()) || s->priority() >= below) continue;
    if (!victim || s->priority() < victim->priority() ||
        (s->priority() == victim->priority() && s->admitted_order > victim->admitted_order)) {
      victim = s;
    }
  }
  return victim;
}

}  // namespace inferd

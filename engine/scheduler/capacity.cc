#include "engine/scheduler/capacity.h"

#include <optional>
#include <span>

namespace inferd {

std::vector<int32_t> Capacity::AllocateDevice(int32_t n, CopyBatch* batch) {
  if (!shares_.cache) return pool_->Allocate(n);
  std::vector<EvictedBlock> evicted;
  std::vector<int32_t> blocks = pool_->Allocate(n, &evicted);
  for (const EvictedBlock& e : evicted) WriteBack(e.block, e.key, e.parent, e.tokens, batch);
  return blocks;
}

bool Capacity::WriteBack(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens,
                         CopyBatch* batch) {
  if (host_pool_->Knows(key) || !host_pool_->CanAllocate(1)) return false;
  const int32_t host = host_pool_->Allocate(1)[0];  // the least recently used host block, cached or not
  host_pool_->Remember(host, key, parent, tokens);  // a restore copies after this batch's outs wrote it
  batch->out.push_back({block, host});
  HoldUntilDone(*batch, std::span<const int32_t>(&host, 1));
  counters_.offloaded_blocks++;
  return true;
}

void Capacity::WriteAhead(int32_t max_blocks, CopyBatch* batch) {
  if (!shares_.cache || max_blocks <= 0) return;
  int32_t written = 0;
  // The scan is bounded: blocks already on the host are passed over, at most a few times max_blocks of them.
  for (int32_t block : pool_->NextEvicted(8 * max_blocks, 8 * max_blocks)) {
    if (written == max_blocks) break;
    written += WriteBack(block, pool_->KeyOf(block), pool_->ParentOf(block), pool_->TokensOf(block), batch);
  }
}

void Capacity::HoldUntilDone(const CopyBatch& batch, std::span<const int32_t> host_blocks) {
  if (host_blocks.empty()) return;
  if (in_flight_.empty() || in_flight_.back().ticket != batch.ticket) in_flight_.push_back({batch.ticket, {}});
  in_flight_.back().host_blocks.insert(in_flight_.back().host_blocks.end(), host_blocks.begin(), host_blocks.end());
}

bool Capacity::Grow(Sequence* seq, int32_t num_tokens, int32_t headroom, CopyBatch* batch) {
  const int32_t need = BlocksFor(num_tokens, block_size_) - static_cast<int32_t>(seq->block_table.size());
  if (need <= 0) return true;
  if (!pool_->CanAllocate(need + headroom)) return false;
  const std::vector<int32_t> blocks = AllocateDevice(need, batch);
  seq->block_table.insert(seq->block_table.end(), blocks.begin(), blocks.end());
  return true;
}

void Capacity::ReusePrefix(Sequence* seq) {
  if (!seq->block_table.empty()) return;
  int32_t found = 0;
  if (prefix_caching_) {
    const int32_t max_blocks = (seq->num_tokens() - 1) / block_size_;  // the last token is computed: it samples
    uint64_t parent = 0;
    for (int32_t i = 0; i < max_blocks; ++i) {
      const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * block_size_, block_size_);
      const uint64_t key = BlockPool::BlockKey(parent, tokens);
      if (seq->restoring.empty()) {  // still on the device tier
        if (const std::optional<int32_t> block = pool_->Reuse(key, tokens)) {
          seq->block_table.push_back(*block);
          seq->block_keys.push_back(key);
          parent = key;
          ++found;
          continue;
        }
      }
      const std::optional<int32_t> host = shares_.cache ? host_pool_->Reuse(key, tokens) : std::nullopt;
      if (!host) break;
      seq->restoring.push_back(*host);
      parent = key;
      ++found;
    }
  }
  seq->num_computed = found * block_size_;
}

bool Capacity::Restore(Sequence* seq, int32_t headroom, CopyBatch* batch) {
  const int32_t on_device = static_cast<int32_t>(seq->block_table.size());
  if (!Grow(seq, seq->num_computed, headroom, batch)) return false;
  for (size_t i = 0; i < seq->restoring.size(); ++i)
    batch->in.push_back({seq->block_table[on_device + i], seq->restoring[i]});
  HoldUntilDone(*batch, seq->restoring);
  counters_.restored_blocks += static_cast<int64_t>(seq->restoring.size());
  if (seq->num_preemptions == 0)
    counters_.host_hit_tokens += int64_t{block_size_} * static_cast<int64_t>(seq->restoring.size());
  seq->restoring.clear();
  seq->loading_ticket = batch->ticket;
  return true;
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
    const uint64_t parent = i == 0 ? 0 : seq->block_keys[i - 1];
    const uint64_t key = BlockPool::BlockKey(parent, tokens);
    pool_->Remember(seq->block_table[i], key, parent, tokens);
    seq->block_keys.push_back(key);
  }
}

void Capacity::Release(Sequence* seq) {
  pool_->Free(seq->block_table);
  if (!seq->restoring.empty()) host_pool_->Free(seq->restoring);  // found, not copied: cached again
  seq->restoring.clear();
  seq->block_table.clear();
  seq->block_keys.clear();
  seq->num_computed = 0;
}

void Capacity::Preempt(Sequence* seq, CopyBatch* batch) {
  counters_.preemptions++;
  seq->num_preemptions++;
  seq->tokens_at_preemption = seq->num_tokens();
  const int32_t computed = BlocksFor(seq->num_computed, block_size_);
  if (host_pool_ && computed > 0 && swap_held_ + computed <= shares_.swap_blocks && host_pool_->CanAllocate(computed)) {
    seq->swapped_blocks = host_pool_->Allocate(computed);
    swap_held_ += computed;
    for (int32_t i = 0; i < computed; ++i) batch->out.push_back({seq->block_table[i], seq->swapped_blocks[i]});
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

bool Capacity::SwapIn(Sequence* seq, int32_t headroom, CopyBatch* batch) {
  const int32_t need = BlocksFor(seq->num_computed, block_size_);
  const int32_t swapped = static_cast<int32_t>(seq->swapped_blocks.size());
  if (!seq->block_table.empty() || need != swapped || !pool_->CanAllocate(need + headroom)) return false;
  seq->block_table = AllocateDevice(need, batch);
  for (int32_t i = 0; i < swapped; ++i) batch->in.push_back({seq->block_table[i], seq->swapped_blocks[i]});
  HoldUntilDone(*batch, seq->swapped_blocks);
  swap_held_ -= swapped;
  counters_.swapped_in_blocks += swapped;
  seq->swapped_blocks.clear();
  seq->loading_ticket = batch->ticket;
  return true;
}

void Capacity::CopiesCompleted(uint64_t ticket) {
  while (!in_flight_.empty() && in_flight_.front().ticket <= ticket) {
    host_pool_->Free(in_flight_.front().host_blocks);  // cached host-tier blocks stay cached
    in_flight_.pop_front();
  }
}

std::vector<int32_t> Capacity::host_blocks_in_flight() const {
  std::vector<int32_t> out;
  for (const Held& h : in_flight_) out.insert(out.end(), h.host_blocks.begin(), h.host_blocks.end());
  return out;
}

void Capacity::Finish(Sequence* seq) {
  if (!seq->swapped_blocks.empty()) {
    host_pool_->Free(seq->swapped_blocks);
    swap_held_ -= static_cast<int32_t>(seq->swapped_blocks.size());
  }
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

#include "engine/scheduler/capacity.h"

#include <algorithm>
#include <optional>
#include <span>

namespace inferd {

uint64_t Capacity::GroupKey(uint64_t key, int32_t group) {
  return group == 0 || key == 0 ? key : BlockPool::BlockKey(key, std::span<const int32_t>(&group, 1));
}

std::vector<int32_t> Capacity::HeldBlocks(const std::vector<std::vector<int32_t>>& tables) {
  std::vector<int32_t> held;
  for (const std::vector<int32_t>& table : tables) {
    for (int32_t b : table) {
      if (b != kNoBlock) held.push_back(b);
    }
  }
  return held;
}

std::vector<int32_t> Capacity::AllocateDevice(int32_t n, CopyBatch* batch) {
  if (!shares_.cache) return pool_->Allocate(n);
  std::vector<EvictedBlock> evicted;
  std::vector<int32_t> blocks = pool_->Allocate(n, &evicted);
  for (const EvictedBlock& e : evicted) WriteBack(e.block, e.key, e.parent, e.tokens, e.announced, batch);
  return blocks;
}

bool Capacity::WriteBack(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens, bool announced,
                         CopyBatch* batch) {
  if (host_pool_->Knows(key) || !host_pool_->CanAllocate(1)) return false;
  const int32_t host = host_pool_->Allocate(1)[0];             // the least recently used host block, cached or not
  host_pool_->Remember(host, key, parent, tokens, announced);  // a restore copies after this batch's outs wrote it
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
    written += WriteBack(block, pool_->KeyOf(block), pool_->ParentOf(block), pool_->TokensOf(block),
                         pool_->AnnouncedOf(block), batch);
  }
}

void Capacity::HoldUntilDone(const CopyBatch& batch, std::span<const int32_t> host_blocks) {
  if (host_blocks.empty()) return;
  if (in_flight_.empty() || in_flight_.back().ticket != batch.ticket) in_flight_.push_back({batch.ticket, {}});
  in_flight_.back().host_blocks.insert(in_flight_.back().host_blocks.end(), host_blocks.begin(), host_blocks.end());
}

void Capacity::Trim(Sequence* seq, int32_t start) {
  for (int32_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& table = seq->block_tables[g];
    const int32_t first = std::min<int32_t>(FirstNeeded(g, start), static_cast<int32_t>(table.size()));
    for (int32_t i = 0; i < first; ++i) {
      if (table[i] == kNoBlock) continue;
      pool_->Free(std::span<const int32_t>(&table[i], 1));  // full and computed: it stays cached
      table[i] = kNoBlock;
    }
  }
}

bool Capacity::Grow(Sequence* seq, int32_t num_tokens, int32_t headroom, CopyBatch* batch) {
  seq->block_tables.resize(num_groups());
  const int32_t start = seq->num_computed, end = BlocksFor(num_tokens, block_size_);
  Trim(seq, start);
  int32_t need = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& table = seq->block_tables[g];
    for (int32_t i = FirstNeeded(g, start); i < end; ++i) {
      need += i >= static_cast<int32_t>(table.size()) || table[i] == kNoBlock;
    }
  }
  if (need == 0) return true;
  if (!pool_->CanAllocate(need + headroom)) return false;
  const std::vector<int32_t> blocks = AllocateDevice(need, batch);
  size_t next = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& table = seq->block_tables[g];
    if (static_cast<int32_t>(table.size()) < end) table.resize(end, kNoBlock);
    for (int32_t i = FirstNeeded(g, start); i < end; ++i) {
      if (table[i] == kNoBlock) table[i] = blocks[next++];
    }
  }
  return true;
}

void Capacity::ReusePrefix(Sequence* seq) {
  if (!HeldBlocks(seq->block_tables).empty() || !seq->restoring.empty()) return;
  seq->block_tables.assign(num_groups(), {});
  int32_t hit = 0;
  std::vector<uint64_t> keys;
  // found[g][i]: group g's block i is on the device (1), on the host tier (2), or neither (0).
  std::vector<std::vector<char>> found(num_groups());
  if (prefix_caching_) {
    const int32_t max_blocks = (seq->num_tokens() - 1) / block_size_;  // the last token is computed: it samples
    uint64_t parent = 0;
    for (int32_t i = 0; i < max_blocks; ++i) {
      const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * block_size_, block_size_);
      const uint64_t key = BlockPool::BlockKey(parent, tokens);
      bool global_missing = false;
      for (int32_t g = 0; g < num_groups(); ++g) {
        const uint64_t group_key = GroupKey(key, g);
        const char where = pool_->Holds(group_key, tokens)                         ? 1
                           : shares_.cache && host_pool_->Holds(group_key, tokens) ? 2
                                                                                   : 0;
        found[g].push_back(where);
        global_missing |= windows_[g] == 0 && where == 0;
      }
      if (global_missing) break;
      keys.push_back(key);
      parent = key;
    }
    // The longest prefix h whose blocks [FirstNeeded(g, h * block_size), h) every group found.
    std::vector<std::vector<int32_t>> missing(num_groups());  // missing[g][i]: blocks not found before i
    for (int32_t g = 0; g < num_groups(); ++g) {
      missing[g].assign(keys.size() + 1, 0);
      for (size_t i = 0; i < keys.size(); ++i) missing[g][i + 1] = missing[g][i] + (found[g][i] == 0);
    }
    for (hit = static_cast<int32_t>(keys.size()); hit > 0; --hit) {
      bool complete = true;
      for (int32_t g = 0; g < num_groups() && complete; ++g) {
        complete = missing[g][hit] == missing[g][FirstNeeded(g, hit * block_size_)];
      }
      if (complete) break;
    }
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& table = seq->block_tables[g];
    table.assign(hit, kNoBlock);
    for (int32_t i = FirstNeeded(g, hit * block_size_); i < hit; ++i) {
      const std::span<const int32_t> tokens(seq->tokens.data() + int64_t{i} * block_size_, block_size_);
      const uint64_t key = GroupKey(keys[i], g);
      if (found[g][i] == 1) {
        table[i] = *pool_->Reuse(key, tokens);
      } else {
        seq->restoring.push_back({g, i, *host_pool_->Reuse(key, tokens)});
      }
    }
  }
  seq->block_keys.assign(keys.begin(), keys.begin() + hit);
  seq->num_computed = hit * block_size_;
}

bool Capacity::Restore(Sequence* seq, int32_t headroom, CopyBatch* batch) {
  const int32_t n = static_cast<int32_t>(seq->restoring.size());
  if (!pool_->CanAllocate(n + headroom)) return false;
  const std::vector<int32_t> blocks = AllocateDevice(n, batch);
  std::vector<int32_t> hosts;
  std::vector<char> restored_index(seq->block_keys.size(), 0);
  for (int32_t k = 0; k < n; ++k) {
    const Sequence::HostBlock& r = seq->restoring[k];
    seq->block_tables[r.group][r.index] = blocks[k];
    batch->in.push_back({blocks[k], r.block});
    hosts.push_back(r.block);
    restored_index[r.index] = 1;
  }
  HoldUntilDone(*batch, hosts);
  counters_.restored_blocks += n;
  if (seq->num_preemptions == 0) {
    const int64_t indices = std::count(restored_index.begin(), restored_index.end(), 1);
    counters_.host_hit_tokens += int64_t{block_size_} * indices;
  }
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
    for (int32_t g = 0; g < num_groups(); ++g) {
      const std::vector<int32_t>& table = seq->block_tables[g];
      if (i < static_cast<int32_t>(table.size()) && table[i] != kNoBlock) {
        pool_->Remember(table[i], GroupKey(key, g), GroupKey(parent, g), tokens, /*announce=*/g == 0);
      }
    }
    seq->block_keys.push_back(key);
  }
}

void Capacity::Shrink(Sequence* seq) {
  const int32_t keep = BlocksFor(seq->num_tokens(), block_size_);
  for (std::vector<int32_t>& table : seq->block_tables) {
    if (static_cast<int32_t>(table.size()) <= keep) continue;
    std::vector<int32_t> spare;
    for (auto b = table.begin() + keep; b != table.end(); ++b) {
      if (*b != kNoBlock) spare.push_back(*b);
    }
    pool_->Free(spare);
    table.resize(keep);
  }
}

void Capacity::Release(Sequence* seq) {
  pool_->Free(HeldBlocks(seq->block_tables));
  for (const Sequence::HostBlock& r : seq->restoring) {
    host_pool_->Free(std::span<const int32_t>(&r.block, 1));  // found, not copied: cached again
  }
  seq->restoring.clear();
  seq->block_tables.assign(num_groups(), {});
  seq->block_keys.clear();
  seq->num_computed = 0;
}

void Capacity::Preempt(Sequence* seq, CopyBatch* batch) {
  counters_.preemptions++;
  seq->num_preemptions++;
  seq->tokens_at_preemption = seq->num_tokens();
  // The blocks of its computed tokens, every group's that it still holds.
  const int32_t computed = BlocksFor(seq->num_computed, block_size_);
  std::vector<std::vector<int32_t>> kept(num_groups());
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& table = seq->block_tables[g];
    kept[g].assign(table.begin(), table.begin() + std::min<size_t>(computed, table.size()));
  }
  const int32_t n = static_cast<int32_t>(HeldBlocks(kept).size());
  if (host_pool_ && n > 0 && swap_held_ + n <= shares_.swap_blocks && host_pool_->CanAllocate(n)) {
    const std::vector<int32_t> hosts = host_pool_->Allocate(n);
    size_t next = 0;
    for (std::vector<int32_t>& table : kept) {
      for (int32_t& b : table) {
        if (b == kNoBlock) continue;
        batch->out.push_back({b, hosts[next]});
        b = hosts[next++];
      }
    }
    seq->swapped_blocks = std::move(kept);
    swap_held_ += n;
    counters_.swapped_preemptions++;
    counters_.swapped_blocks += n;
    const int32_t keep = seq->num_computed;
    Release(seq);
    seq->num_computed = keep;  // its KV waits on the host
    return;
  }
  counters_.preempted_tokens += seq->num_computed;
  Release(seq);
}

bool Capacity::SwapIn(Sequence* seq, int32_t headroom, CopyBatch* batch) {
  const std::vector<int32_t> hosts = HeldBlocks(seq->swapped_blocks);
  const int32_t n = static_cast<int32_t>(hosts.size());
  if (!HeldBlocks(seq->block_tables).empty() || !pool_->CanAllocate(n + headroom)) return false;
  const std::vector<int32_t> blocks = AllocateDevice(n, batch);
  seq->block_tables = seq->swapped_blocks;
  size_t next = 0;
  for (std::vector<int32_t>& table : seq->block_tables) {
    for (int32_t& b : table) {
      if (b == kNoBlock) continue;
      batch->in.push_back({blocks[next], b});
      b = blocks[next++];
    }
  }
  HoldUntilDone(*batch, hosts);
  swap_held_ -= n;
  counters_.swapped_in_blocks += n;
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
    const std::vector<int32_t> hosts = HeldBlocks(seq->swapped_blocks);
    host_pool_->Free(hosts);
    swap_held_ -= static_cast<int32_t>(hosts.size());
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

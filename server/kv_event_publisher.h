// KV-cache events for KV-aware routers, as vLLM publishes them (its `kv_events` ZeroMQ publisher), so that a router
// written for vLLM replicas can index inferd's prefix caches unchanged:
// - a PUB socket at kv_events.endpoint sends each batch as three frames: the topic, the batch's sequence number
//   (8 bytes, big-endian, from 0) and the batch, msgpack-encoded as vLLM's msgspec structs: the batch array-like,
//   [ts, [event, ...]], each event a map tagged by "type": {type: BlockStored, block_hashes: [hash],
//   parent_block_hash: hash or nil, token_ids, block_size, lora_id: nil, medium, lora_name: nil},
//   {type: BlockRemoved, block_hashes: [hash], medium} or {type: AllBlocksCleared} (vllm-router 0.1.17's KV index
//   reads exactly these; it refuses array-like events). Hashes are the prefix cache's own chained keys
//   (BlockPool::BlockKey); the medium is "GPU" for the device tier (the engine's pool on any backend) and "CPU"
//   for the host tier;
// - an optional ROUTER socket at kv_events.replay_endpoint answers a subscriber's request frame (a sequence number,
//   8 bytes big-endian) with every batch it still holds from that number on, each as [sequence, batch], then
//   [-1, empty];
// - the first batch (sequence 0) is AllBlocksCleared: whatever a subscriber knew of an earlier process at this
//   address is gone.
// The engine thread hands batches over (Publish never blocks on the network); one thread of the publisher's own
// owns both sockets.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/kv_cache/block_pool.h"

namespace inferd {

// One batch's msgpack bytes (the payload frame), at `ts` seconds since the epoch.
std::string EncodeKvEventBatch(double ts, const std::vector<KvCacheEvent>& events, int32_t block_size);

class KvEventPublisher {
 public:
  // Binds the sockets (an address ZeroMQ refuses is an error naming the key and the address) and starts the thread.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(const KvEventsSection& config, int32_t block_size);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch of events (from the engine thread). Past kMaxQueued batches not yet sent the oldest are
  // dropped and counted; their sequence numbers are skipped, so a subscriber sees the gap (and a replay cannot
  // fill it: its index is stale, as with vLLM's publisher).
  void Publish(std::vector<KvCacheEvent> events);
  static constexpr size_t kMaxQueued = 100000;
  uint64_t dropped() const { return dropped_; }

 private:
  struct Sockets;
  KvEventPublisher() = default;
  void Run();

  KvEventsSection config_;
  int32_t block_size_ = 0;
  std::unique_ptr<Sockets> sockets_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<double, std::vector<KvCacheEvent>>> queue_;  // under mu_
  bool stop_ = false;                                               // under mu_
  int64_t unsent_drops_ = 0;  // under mu_: batches dropped since the thread last took the queue
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace inferd

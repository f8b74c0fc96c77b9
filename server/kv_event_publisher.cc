#include "server/kv_event_publisher.h"

#define MP_SOURCE 1  // msgpuck's out-of-line functions and tables live in this unit
#include <msgpuck.h>

#include <chrono>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace inferd {
namespace {

// Appends msgpack values to a byte string: each writer is told how many bytes its value takes.
class Packer {
 public:
  template <typename Encode>
  void Put(uint32_t bytes, Encode encode) {
    const size_t at = out_.size();
    out_.resize(at + bytes);
    encode(out_.data() + at);
  }
  void Array(uint32_t n) {
    Put(mp_sizeof_array(n), [n](char* p) { mp_encode_array(p, n); });
  }
  void Map(uint32_t n) {
    Put(mp_sizeof_map(n), [n](char* p) { mp_encode_map(p, n); });
  }
  void Uint(uint64_t v) {
    Put(mp_sizeof_uint(v), [v](char* p) { mp_encode_uint(p, v); });
  }
  void Int(int64_t v) {
    if (v >= 0) return Uint(static_cast<uint64_t>(v));
    Put(mp_sizeof_int(v), [v](char* p) { mp_encode_int(p, v); });
  }
  void Double(double v) {
    Put(mp_sizeof_double(v), [v](char* p) { mp_encode_double(p, v); });
  }
  void Nil() {
    Put(mp_sizeof_nil(), [](char* p) { mp_encode_nil(p); });
  }
  void Str(std::string_view s) {
    const auto n = static_cast<uint32_t>(s.size());
    Put(mp_sizeof_str(n), [s, n](char* p) { mp_encode_str(p, s.data(), n); });
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string SequenceBytes(int64_t seq) {  // 8 bytes, big-endian, two's complement (the end marker is -1)
  std::string b(8, '\0');
  const auto u = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((u >> (8 * (7 - i))) & 0xFF);
  return b;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string EncodeKvEventBatch(double ts, const std::vector<KvCacheEvent>& events, int32_t block_size) {
  Packer p;
  p.Array(2);  // [ts, events]: data_parallel_rank is left out (its default, None)
  p.Double(ts);
  p.Array(static_cast<uint32_t>(events.size()));
  for (const KvCacheEvent& e : events) {  // each a map tagged by "type" (msgspec's tag=True structs)
    const char* medium = e.host ? "CPU" : "GPU";
    switch (e.kind) {
      case KvCacheEvent::Kind::kStored:
        p.Map(8);
        p.Str("type");
        p.Str("BlockStored");
        p.Str("block_hashes");
        p.Array(1);
        p.Uint(e.key);
        p.Str("parent_block_hash");
        if (e.parent != 0) {
          p.Uint(e.parent);
        } else {
          p.Nil();
        }
        p.Str("token_ids");
        p.Array(static_cast<uint32_t>(e.tokens.size()));
        for (int32_t t : e.tokens) p.Int(t);
        p.Str("block_size");
        p.Int(block_size);
        p.Str("lora_id");
        p.Nil();
        p.Str("medium");
        p.Str(medium);
        p.Str("lora_name");
        p.Nil();
        break;
      case KvCacheEvent::Kind::kRemoved:
        p.Map(3);
        p.Str("type");
        p.Str("BlockRemoved");
        p.Str("block_hashes");
        p.Array(1);
        p.Uint(e.key);
        p.Str("medium");
        p.Str(medium);
        break;
      case KvCacheEvent::Kind::kAllCleared:
        p.Map(1);
        p.Str("type");
        p.Str("AllBlocksCleared");
        break;
    }
  }
  return p.Take();
}

struct KvEventPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  zmq::socket_t replay{context, zmq::socket_type::router};
  bool has_replay = false;
};

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(const KvEventsSection& config,
                                                                          int32_t block_size) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher());
  p->config_ = config;
  p->block_size_ = block_size;
  p->sockets_ = std::make_unique<Sockets>();
  Sockets& s = *p->sockets_;
  const auto bind = [](zmq::socket_t& socket, const std::string& key, const std::string& address) -> absl::Status {
    try {
      socket.set(zmq::sockopt::linger, 0);  // closing never waits for a subscriber
      socket.bind(address);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: kv_events.", key, " = '", address.substr(0, 200), "' cannot be bound: ", e.what()));
    }
    return absl::OkStatus();
  };
  s.pub.set(zmq::sockopt::sndhwm, 100000);
  if (absl::Status st = bind(s.pub, "endpoint", config.endpoint); !st.ok()) return st;
  if (!config.replay_endpoint.empty()) {
    s.replay.set(zmq::sockopt::maxmsgsize,
                 int64_t{1024});  // a request is an 8-byte frame: a peer sending more is dropped
    if (absl::Status st = bind(s.replay, "replay_endpoint", config.replay_endpoint); !st.ok()) return st;
    s.has_replay = true;
  }
  KvCacheEvent cleared;
  cleared.kind = KvCacheEvent::Kind::kAllCleared;
  p->queue_.push_back({Now(), {cleared}});
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  spdlog::info("KV-cache events on {} (topic '{}'){}", config.endpoint, config.topic,
               s.has_replay ? absl::StrCat(", replays on ", config.replay_endpoint) : "");
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::Publish(std::vector<KvCacheEvent> events) {
  if (events.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueued) {
      queue_.pop_front();
      ++unsent_drops_;
      if (dropped_++ == 0) spdlog::warn("KV-cache events: the publisher fell behind; batches are dropped");
    }
    queue_.push_back({Now(), std::move(events)});
  }
  wake_.notify_one();
}

void KvEventPublisher::Run() {
  Sockets& s = *sockets_;
  int64_t seq = 0;
  std::deque<std::pair<int64_t, std::string>> sent;  // the last buffer_steps batches, for replays
  for (bool stopping = false; !stopping;) {
    std::deque<std::pair<double, std::vector<KvCacheEvent>>> batches;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Wakes for new batches, and at least every 10 ms to answer replay requests.
      wake_.wait_for(lock, std::chrono::milliseconds(10), [&] { return stop_ || !queue_.empty(); });
      batches.swap(queue_);
      seq += unsent_drops_;  // dropped batches keep their numbers: a subscriber sees the gap
      unsent_drops_ = 0;
      stopping = stop_;
    }
    try {
      for (auto& [ts, events] : batches) {
        std::string payload = EncodeKvEventBatch(ts, events, block_size_);
        s.pub.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore);
        s.pub.send(zmq::buffer(SequenceBytes(seq)), zmq::send_flags::sndmore);
        s.pub.send(zmq::buffer(payload), zmq::send_flags::none);
        sent.emplace_back(seq++, std::move(payload));
        if (sent.size() > static_cast<size_t>(config_.buffer_steps)) sent.pop_front();
      }
      while (s.has_replay) {  // every waiting request: [identity, (empty,) first sequence number]
        std::vector<zmq::message_t> frames;
        zmq::message_t frame;
        if (!s.replay.recv(frame, zmq::recv_flags::dontwait)) break;
        bool more = frame.more();
        frames.push_back(std::move(frame));
        while (more) {  // the rest of the message; past 4 frames it is not a request and is only drained
          (void)s.replay.recv(frame, zmq::recv_flags::none);
          more = frame.more();
          if (frames.size() < 4) frames.push_back(std::move(frame));
        }
        const bool delimited = frames.size() == 3 && frames[1].size() == 0;  // a REQ socket's envelope
        const zmq::message_t& ask = frames.back();
        if (frames.size() < 2 || frames.size() > 3 || ask.size() != 8) continue;  // not a replay request: no answer
        int64_t from = 0;
        for (size_t i = 0; i < 8; ++i) from = (from << 8) | static_cast<uint8_t>(ask.data<char>()[i]);
        const std::string identity(frames[0].data<char>(), frames[0].size());
        const auto reply = [&](const std::string& sequence, const std::string& payload) {
          s.replay.send(zmq::buffer(identity), zmq::send_flags::sndmore);
          if (delimited) s.replay.send(zmq::const_buffer(), zmq::send_flags::sndmore);
          s.replay.send(zmq::buffer(sequence), zmq::send_flags::sndmore);
          s.replay.send(zmq::buffer(payload), zmq::send_flags::none);
        };
        for (const auto& [n, payload] : sent) {
          if (n >= from) reply(SequenceBytes(n), payload);
        }
        reply(SequenceBytes(-1), "");
      }
    } catch (const zmq::error_t& e) {
      spdlog::warn("KV-cache events: {}", e.what());
    }
  }
}

}  // namespace inferd

// `inferd-bench serve --multi-turn`: N simulated users, each holding a conversation of K turns with a running
// inferd (gRPC, greedy, token ids). A turn's prompt is the user's whole history — a system prompt all users share,
// then every earlier user message and answer — plus a new user message; the answer is appended to the history,
// and the user thinks (exponentially distributed, mean --think-time) before the next turn. This is the workload
// the prefix cache's host tier is for: histories that come back after minutes, more of them than the device pool
// holds. Reports TTFT (p50 / p90 / p99, all turns and the turns after the first), total token throughput, the
// prefix cache's hit rate per tier and the device's idle share over the run (GetServerInfo before and after).
#include "tools/multi_turn_bench.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "inferd/v1/inferd.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/latency_stats.h"

namespace inferd {
namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = inferd::v1;

struct Options {
  std::string address = "127.0.0.1:50051";
  int users = 16, turns = 6;
  int system_len = 1000, turn_len = 400, output_len = 100;  // tokens
  double think_time_s = 2.0;                                // mean
  uint32_t seed = 0;
  std::string json_path;
};

struct Turn {
  bool ok = false;
  int index = 0;
  double ttft = 0, latency = 0;
  int prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  std::string error;
};

// One turn, streamed: appends the answer's ids to *history.
Turn RunTurn(v1::Inference::Stub& stub, std::vector<int32_t>* history, int max_tokens) {
  v1::GenerateRequest r;
  for (int32_t id : *history) r.mutable_token_ids()->add_ids(id);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stopping()->set_max_tokens(max_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  Turn t;
  grpc::ClientContext ctx;
  const Clock::time_point t0 = Clock::now();
  auto stream = stub.GenerateStream(&ctx, r);
  v1::GenerateChunk chunk;
  while (stream->Read(&chunk)) {
    if (chunk.token_ids_size() > 0 && t.output_tokens == 0) {
      t.ttft = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    for (int32_t id : chunk.token_ids()) history->push_back(id);
    t.output_tokens += chunk.token_ids_size();
    if (chunk.has_usage()) {
      t.prompt_tokens = chunk.usage().prompt_tokens();
      t.cached_tokens = chunk.usage().cached_prompt_tokens();
    }
  }
  const grpc::Status status = stream->Finish();
  t.latency = std::chrono::duration<double>(Clock::now() - t0).count();
  t.ok = status.ok() && t.output_tokens > 0;
  if (!status.ok()) t.error = status.error_message();
  return t;
}

bool Info(v1::Inference::Stub& stub, v1::ServerInfo* info) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub.GetServerInfo(&ctx, v1::GetServerInfoRequest(), info).ok();
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    auto num = [&](int* out, int min) { return has && absl::SimpleAtoi(argv[++i], out) && *out >= min; };
    bool ok = true;
    if (a == "--address" && has) {
      o->address = argv[++i];
    } else if (a == "--users") {
      ok = num(&o->users, 1);
    } else if (a == "--turns") {
      ok = num(&o->turns, 1);
    } else if (a == "--system-len") {
      ok = num(&o->system_len, 0);
    } else if (a == "--turn-len") {
      ok = num(&o->turn_len, 1);
    } else if (a == "--output-len") {
      ok = num(&o->output_len, 1);
    } else if (a == "--think-time") {
      ok = has && absl::SimpleAtod(argv[++i], &o->think_time_s) && o->think_time_s >= 0;
    } else if (a == "--seed") {
      ok = has && absl::SimpleAtoi(argv[++i], &o->seed);
    } else if (a == "--json" && has) {
      o->json_path = argv[++i];
    } else {
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace

int MultiTurnMain(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: inferd-bench serve --multi-turn [--address HOST:PORT] [--users N] [--turns K]\n"
                 "         [--system-len TOKENS] [--turn-len TOKENS] [--output-len TOKENS] [--think-time S]\n"
                 "         [--seed S] [--json FILE]\n");
    return 2;
  }
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(o.address, grpc::InsecureChannelCredentials()));
  v1::ModelInfo model;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &model); !s.ok()) {
      std::fprintf(stderr, "serve: no inferd at %s: %s\n", o.address.c_str(), s.error_message().c_str());
      return 1;
    }
  }
  const int64_t longest = o.system_len + int64_t{o.turns} * (o.turn_len + o.output_len);
  if (longest >= model.max_model_len()) {
    std::fprintf(stderr, "serve: a history reaches %lld tokens; the model allows %d: fewer turns or shorter ones\n",
                 static_cast<long long>(longest), model.max_model_len());
    return 2;
  }
  std::mt19937 seed_rng(o.seed);
  std::uniform_int_distribution<int32_t> id(10, std::max(10, model.vocab_size() - 1));
  std::vector<int32_t> system(o.system_len);
  for (int32_t& t : system) t = id(seed_rng);
  v1::ServerInfo before, after;
  if (!Info(*stub, &before)) {
    std::fprintf(stderr, "serve: GetServerInfo failed\n");
    return 1;
  }
  std::mutex mu;
  std::vector<Turn> turns;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> users;
  for (int u = 0; u < o.users; ++u) {
    users.emplace_back([&, u] {
      std::mt19937 rng(o.seed * 7919 + u + 1);
      std::uniform_int_distribution<int32_t> word(10, std::max(10, model.vocab_size() - 1));
      std::exponential_distribution<double> think(o.think_time_s > 0 ? 1.0 / o.think_time_s : 1.0);
      // Users arrive spread over one think time, as a service's do.
      std::uniform_real_distribution<double> arrive(0, o.think_time_s);
      std::this_thread::sleep_for(std::chrono::duration<double>(arrive(rng)));
      std::vector<int32_t> history = system;
      for (int k = 0; k < o.turns; ++k) {
        for (int i = 0; i < o.turn_len; ++i) history.push_back(word(rng));
        Turn t = RunTurn(*stub, &history, o.output_len);
        t.index = k;
        const bool ok = t.ok;
        {
          std::lock_guard<std::mutex> lock(mu);
          turns.push_back(std::move(t));
          std::fprintf(stderr, "\rturns done: %zu/%d", turns.size(), o.users * o.turns);
        }
        if (!ok) return;
        if (o.think_time_s > 0 && k + 1 < o.turns) {
          std::this_thread::sleep_for(std::chrono::duration<double>(think(rng)));
        }
      }
    });
  }
  for (std::thread& t : users) t.join();
  std::fprintf(stderr, "\n");
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  Info(*stub, &after);
  std::vector<double> ttft, ttft_later;
  int64_t input = 0, output = 0, cached = 0;
  int completed = 0;
  nlohmann::json errors = nlohmann::json::array();
  for (const Turn& t : turns) {
    if (!t.ok) {
      if (errors.size() < 5) errors.push_back(t.error);
      continue;
    }
    ++completed;
    ttft.push_back(t.ttft);
    if (t.index > 0) ttft_later.push_back(t.ttft);
    input += t.prompt_tokens;
    output += t.output_tokens;
    cached += t.cached_tokens;
  }
  const double queried = after.prefix_cache_query_tokens() - before.prefix_cache_query_tokens();
  const double hits = after.prefix_cache_hit_tokens() - before.prefix_cache_hit_tokens();
  const double host_hits = after.host_prefix_cache_hit_tokens() - before.host_prefix_cache_hit_tokens();
  const double busy = after.device_busy_seconds() - before.device_busy_seconds();
  const nlohmann::json r = {
      {"model", model.name()},
      {"users", o.users},
      {"turns", o.turns},
      {"system_len", o.system_len},
      {"turn_len", o.turn_len},
      {"output_len", o.output_len},
      {"think_time_s", o.think_time_s},
      {"completed", completed},
      {"failed", o.users * o.turns - completed},
      {"errors", errors},
      {"duration_s", duration},
      {"total_input_tokens", input},
      {"total_output_tokens", output},
      {"cached_prompt_tokens", cached},
      {"total_token_throughput", (input + output) / duration},
      {"ttft", LatencyStats(ttft)},
      {"ttft_after_first_turn", LatencyStats(ttft_later)},
      {"prefix_hit_rate", queried > 0 ? hits / queried : 0.0},
      {"prefix_hit_rate_device", queried > 0 ? (hits - host_hits) / queried : 0.0},
      {"prefix_hit_rate_host", queried > 0 ? host_hits / queried : 0.0},
      {"device_busy_s", busy},
      {"device_idle_share", duration > 0 ? std::max(0.0, 1.0 - busy / duration) : 0.0},
      {"kv_copied_to_host_bytes", after.kv_copied_to_host_bytes() - before.kv_copied_to_host_bytes()},
      {"kv_copied_to_device_bytes", after.kv_copied_to_device_bytes() - before.kv_copied_to_device_bytes()},
      {"kv_copy_s", after.kv_copy_seconds() - before.kv_copy_seconds()},
      {"kv_copy_waited_s", after.kv_copy_waited_seconds() - before.kv_copy_waited_seconds()},
      {"total_kv_blocks", after.total_kv_blocks()},
      {"host_kv_blocks", after.host_kv_blocks()}};
  std::printf("============ Multi-turn Benchmark Result ============\n");
  std::printf("%-40s %d users x %d turns (system %d, +%d a turn, answers of %d; think %.1f s)\n",
              "Conversations:", o.users, o.turns, o.system_len, o.turn_len, o.output_len, o.think_time_s);
  std::printf("%-40s %d of %d\n", "Turns completed:", completed, o.users * o.turns);
  std::printf("%-40s %.2f\n", "Duration (s):", duration);
  std::printf("%-40s %.1f\n", "Total token throughput (tok/s):", (input + output) / duration);
  for (const auto& [name, s] :
       {std::pair{"TTFT, all turns", r["ttft"]}, {"TTFT, turns 2+", r["ttft_after_first_turn"]}}) {
    std::printf("%-40s median %.1f  p90 %.1f  p99 %.1f (ms)\n", name, s["median_ms"].get<double>(),
                s["p90_ms"].get<double>(), s["p99_ms"].get<double>());
  }
  std::printf("%-40s %.3f (device %.3f, host %.3f)\n", "Prefix cache hit rate:", r["prefix_hit_rate"].get<double>(),
              r["prefix_hit_rate_device"].get<double>(), r["prefix_hit_rate_host"].get<double>());
  std::printf("%-40s %.3f\n", "Device idle share:", r["device_idle_share"].get<double>());
  std::printf("%-40s %.1f MiB to the host, %.1f MiB back\n",
              "KV copied:", r["kv_copied_to_host_bytes"].get<double>() / 1048576.0,
              r["kv_copied_to_device_bytes"].get<double>() / 1048576.0);
  const double copy_s = r["kv_copy_s"].get<double>(), waited_s = r["kv_copy_waited_s"].get<double>();
  std::printf("%-40s %.3f s, %.1f %% hidden (a step waited %.3f s)\n", "KV copy time:", copy_s,
              copy_s > 0 ? 100.0 * (1 - waited_s / copy_s) : 100.0, waited_s);
  if (!o.json_path.empty()) std::ofstream(o.json_path) << r.dump(1) << "\n";
  return completed == o.users * o.turns ? 0 : 1;
}

}  // namespace inferd

// `inferd-bench serve`: a serving benchmark against a running inferd over gRPC or (--backend openai) its
// OpenAI-compatible HTTP API with Server-Sent Events (tools/openai_stream.h), with vLLM's serving-benchmark
// definitions so the numbers compare: Poisson (or gamma, for burstiness) arrivals at a request rate, or all at
// once, optionally capped in concurrency; random prompts (token ids) or prompts / chat messages from a JSONL file.
// Reports completed and failed requests, duration, request and token throughput, and mean / median / p90 / p99 of
// time to first token (TTFT), time per output token excluding the first (TPOT), inter-token latency (ITL, between
// streamed chunks) and end-to-end latency (E2EL), plus goodput for given SLOs. A list of rates runs a sweep and
// writes one CSV row per rate (tools/plot_sweep.py draws it).
#include "tools/serve_bench.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "inferd/v1/inferd.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/latency_stats.h"
#include "tools/openai_stream.h"

namespace inferd {
namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = inferd::v1;

struct Options {
  std::string backend = "grpc";  // or "openai"
  std::string address = "127.0.0.1:50051";
  std::vector<double> rates = {INFINITY};  // requests/s; inf = all at once
  double burstiness = 1.0;                 // gamma shape: 1 = Poisson, < 1 burstier, > 1 more regular
  int max_concurrency = 0;                 // 0 = unbounded
  int num_prompts = 200;
  int input_len = 512, output_len = 128;
  double range_ratio = 0.0;  // lengths uniform in [len·(1 − r), len·(1 + r)]
  std::string dataset;       // JSONL: {"prompt": ...} or {"messages": [...]}, optional "max_tokens"
  bool ignore_eos = true;
  int warmup = 2;
  uint32_t seed = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0, slo_e2el_ms = 0;  // goodput SLOs; 0 = not part of it
  std::string json_path, csv_path;
};

using Result = StreamTiming;
// One request through the front end under test.
using Client = std::function<Result(const v1::GenerateRequest&)>;

std::vector<v1::GenerateRequest> MakeRequests(const Options& o, const v1::ModelInfo& model) {
  std::mt19937 rng(o.seed);
  auto around = [&](int len) {
    const int lo = std::max(1, static_cast<int>(len * (1 - o.range_ratio)));
    const int hi = std::max(lo, static_cast<int>(len * (1 + o.range_ratio)));
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::vector<v1::GenerateRequest> out;
  std::vector<nlohmann::json> lines;
  if (!o.dataset.empty()) {
    std::ifstream in(o.dataset);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
    }
    if (lines.empty()) throw std::runtime_error("--dataset " + o.dataset + " holds no JSON lines");
  }
  for (int i = 0; i < o.num_prompts + o.warmup; ++i) {
    v1::GenerateRequest r;
    r.mutable_sampling()->set_temperature(0);
    r.mutable_stopping()->set_ignore_eos(o.ignore_eos);
    int max_tokens = around(o.output_len);
    if (lines.empty()) {
      const int len = std::min(around(o.input_len), model.max_model_len() - max_tokens - 1);
      std::uniform_int_distribution<int> id(10, std::max(10, model.vocab_size() - 1));
      for (int t = 0; t < std::max(1, len); ++t) r.mutable_token_ids()->add_ids(id(rng));
    } else {
      const nlohmann::json& j = lines[i % lines.size()];
      if (j.contains("messages")) {
        for (const auto& m : j["messages"]) {
          v1::ChatMessage* cm = r.mutable_messages()->add_messages();
          cm->set_role(m.value("role", "user"));
          cm->set_content(m.value("content", ""));
        }
      } else {
        r.set_text(j.value("prompt", ""));
      }
      max_tokens = j.value("max_tokens", max_tokens);
    }
    r.mutable_stopping()->set_max_tokens(max_tokens);
    out.push_back(std::move(r));
  }
  return out;
}

Result RunOne(v1::Inference::Stub& stub, const v1::GenerateRequest& request) {
  Result res;
  grpc::ClientContext ctx;
  const Clock::time_point t0 = Clock::now();
  auto stream = stub.GenerateStream(&ctx, request);
  v1::GenerateChunk chunk;
  while (stream->Read(&chunk)) {
    const Clock::time_point now = Clock::now();
    if (chunk.token_ids_size() > 0) {
      res.Chunk(t0, now);
      res.output_tokens += chunk.token_ids_size();
    }
    if (chunk.has_usage()) res.prompt_tokens = chunk.usage().prompt_tokens();
  }
  const grpc::Status status = stream->Finish();
  res.latency = std::chrono::duration<double>(Clock::now() - t0).count();
  res.ok = status.ok() && res.output_tokens > 0;
  if (!status.ok()) res.error = status.error_message();
  return res;
}

// One run at one rate: returns its report.
nlohmann::json RunRate(const Options& o, double rate, const Client& run_one,
                       const std::vector<v1::GenerateRequest>& requests) {
  for (int i = 0; i < o.warmup; ++i) run_one(requests[i]);
  std::mt19937 rng(o.seed + 1);
  std::gamma_distribution<double> gap(o.burstiness, std::isinf(rate) ? 0.0 : 1.0 / (rate * o.burstiness));
  std::vector<Result> results(o.num_prompts);
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, done = 0;
  std::vector<std::thread> threads;
  const Clock::time_point start = Clock::now();
  Clock::time_point next = start;
  for (int i = 0; i < o.num_prompts; ++i) {
    if (!std::isinf(rate)) {
      std::this_thread::sleep_until(next);
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return o.max_concurrency <= 0 || in_flight < o.max_concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      Result r = run_one(requests[o.warmup + i]);
      std::lock_guard<std::mutex> lock(mu);
      results[i] = std::move(r);
      --in_flight;
      ++done;
      std::fprintf(stderr, "\r[%-40s] %d/%d", std::string(40 * done / o.num_prompts, '#').c_str(), done, o.num_prompts);
      cv.notify_all();
    });
  }
  for (std::thread& t : threads) t.join();
  std::fprintf(stderr, "\n");
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t input = 0, output = 0;
  int completed = 0, good = 0;
  nlohmann::json errors = nlohmann::json::array();
  for (const Result& r : results) {
    if (!r.ok) {
      if (errors.size() < 5) errors.push_back(r.error);
      continue;
    }
    ++completed;
    input += r.prompt_tokens;
    output += r.output_tokens;
    ttft.push_back(r.ttft);
    e2el.push_back(r.latency);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    const double t = r.output_tokens > 1 ? (r.latency - r.ttft) / (r.output_tokens - 1) : 0;
    if (r.output_tokens > 1) tpot.push_back(t);
    const bool meets = (o.slo_ttft_ms <= 0 || 1e3 * r.ttft <= o.slo_ttft_ms) &&
                       (o.slo_tpot_ms <= 0 || 1e3 * t <= o.slo_tpot_ms) &&
                       (o.slo_e2el_ms <= 0 || 1e3 * r.latency <= o.slo_e2el_ms);
    good += meets;
  }
  return {{"request_rate", std::isinf(rate) ? -1.0 : rate},
          {"burstiness", o.burstiness},
          {"max_concurrency", o.max_concurrency},
          {"completed", completed},
          {"failed", o.num_prompts - completed},
          {"errors", errors},
          {"duration_s", duration},
          {"total_input_tokens", input},
          {"total_output_tokens", output},
          {"request_throughput", completed / duration},
          {"input_throughput", input / duration},
          {"output_throughput", output / duration},
          {"total_token_throughput", (input + output) / duration},
          {"goodput", good / duration},
          {"slo_ms", {{"ttft", o.slo_ttft_ms}, {"tpot", o.slo_tpot_ms}, {"e2el", o.slo_e2el_ms}}},
          {"ttft", LatencyStats(ttft)},
          {"tpot", LatencyStats(tpot)},
          {"itl", LatencyStats(itl)},
          {"e2el", LatencyStats(e2el)}};
}

void PrintReport(const nlohmann::json& r) {
  std::printf("============ Serving Benchmark Result ============\n");
  const double rate = r["request_rate"];
  std::printf("%-40s %s\n", "Request rate (req/s):", rate < 0 ? "inf" : std::to_string(rate).c_str());
  for (const char* k : {"completed", "failed"}) std::printf("%-40s %d\n", k, r[k].get<int>());
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", r["duration_s"].get<double>());
  std::printf("%-40s %.2f\n", "Request throughput (req/s):", r["request_throughput"].get<double>());
  std::printf("%-40s %.2f\n", "Goodput (req/s):", r["goodput"].get<double>());
  std::printf("%-40s %.2f\n", "Input token throughput (tok/s):", r["input_throughput"].get<double>());
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s):", r["output_throughput"].get<double>());
  std::printf("%-40s %.2f\n", "Total token throughput (tok/s):", r["total_token_throughput"].get<double>());
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    const nlohmann::json& s = r[m];
    std::printf("%-6s mean %9.2f  median %9.2f  p90 %9.2f  p99 %9.2f  (ms)\n", m, s["mean_ms"].get<double>(),
                s["median_ms"].get<double>(), s["p90_ms"].get<double>(), s["p99_ms"].get<double>());
  }
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    auto num = [&](auto* out) { return has && absl::SimpleAtoi(argv[++i], out); };
    auto real = [&](double* out) { return has && absl::SimpleAtod(argv[++i], out); };
    bool ok = true;
    if (a == "--address" && has) {
      o->address = argv[++i];
    } else if (a == "--backend" && has) {
      o->backend = argv[++i];
      ok = o->backend == "grpc" || o->backend == "openai";
    } else if (a == "--request-rate" || a == "--request-rates") {
      if (!has) return false;
      o->rates.clear();
      for (absl::string_view s : absl::StrSplit(argv[++i], ',')) {
        double r = 0;
        if (s == "inf") {
          r = INFINITY;
        } else if (!absl::SimpleAtod(s, &r) || !(r > 0)) {
          return false;
        }
        o->rates.push_back(r);
      }
    } else if (a == "--burstiness") {
      ok = real(&o->burstiness) && o->burstiness > 0;
    } else if (a == "--max-concurrency") {
      ok = num(&o->max_concurrency);
    } else if (a == "--num-prompts") {
      ok = num(&o->num_prompts) && o->num_prompts > 0;
    } else if (a == "--random-input-len") {
      ok = num(&o->input_len) && o->input_len > 0;
    } else if (a == "--random-output-len") {
      ok = num(&o->output_len) && o->output_len > 0;
    } else if (a == "--random-range-ratio") {
      ok = real(&o->range_ratio) && o->range_ratio >= 0 && o->range_ratio < 1;
    } else if (a == "--dataset" && has) {
      o->dataset = argv[++i];
    } else if (a == "--no-ignore-eos") {
      o->ignore_eos = false;
    } else if (a == "--warmup") {
      ok = num(&o->warmup) && o->warmup >= 0;
    } else if (a == "--seed") {
      ok = num(&o->seed);
    } else if (a == "--goodput" && has) {
      for (absl::string_view kv : absl::StrSplit(argv[++i], ',')) {
        std::vector<std::string> p = absl::StrSplit(kv, ':');
        double v = 0;
        if (p.size() != 2 || !absl::SimpleAtod(p[1], &v)) return false;
        if (p[0] == "ttft")
          o->slo_ttft_ms = v;
        else if (p[0] == "tpot")
          o->slo_tpot_ms = v;
        else if (p[0] == "e2el")
          o->slo_e2el_ms = v;
        else
          return false;
      }
    } else if (a == "--json" && has) {
      o->json_path = argv[++i];
    } else if (a == "--csv" && has) {
      o->csv_path = argv[++i];
    } else {
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace

int ServeMain(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: inferd-bench serve [--backend grpc|openai] [--address HOST:PORT]\n"
                 "         [--request-rate R | --request-rates R1,R2,inf]\n"
                 "         [--burstiness B] [--max-concurrency N] [--num-prompts N] [--warmup N] [--seed S]\n"
                 "         [--random-input-len N] [--random-output-len N] [--random-range-ratio r]\n"
                 "         [--dataset FILE.jsonl] [--no-ignore-eos] [--goodput ttft:MS,tpot:MS,e2el:MS]\n"
                 "         [--json FILE] [--csv FILE]\n");
    return 2;
  }
  auto channel = grpc::CreateChannel(o.address, grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  v1::ModelInfo model;
  Client run_one = [&stub](const v1::GenerateRequest& r) { return RunOne(*stub, r); };
  if (o.backend == "openai") {
    std::string error;
    if (!OpenAiModelInfo(o.address, &model, &error)) {
      std::fprintf(stderr, "serve: no OpenAI-compatible server at %s: %s\n", o.address.c_str(), error.c_str());
      return 1;
    }
    run_one = [&o](const v1::GenerateRequest& r) { return RunOpenAiStream(o.address, r); };
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &model);
    if (!s.ok()) {
      std::fprintf(stderr, "serve: no inferd at %s: %s\n", o.address.c_str(), s.error_message().c_str());
      return 1;
    }
  }
  std::vector<v1::GenerateRequest> requests;
  try {
    requests = MakeRequests(o, model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve: %s\n", e.what());
    return 2;
  }
  nlohmann::json runs = nlohmann::json::array();
  for (double rate : o.rates) {
    nlohmann::json r = RunRate(o, rate, run_one, requests);
    r["model"] = model.name();
    r["backend"] = o.backend;
    PrintReport(r);
    runs.push_back(r);
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << (runs.size() == 1 ? runs[0] : runs).dump(1) << "\n";
  if (!o.csv_path.empty()) {
    std::ofstream csv(o.csv_path);
    csv << "request_rate,completed,failed,request_throughput,output_throughput,total_token_throughput,goodput,"
           "ttft_median_ms,ttft_p99_ms,tpot_median_ms,tpot_p99_ms,itl_p99_ms,e2el_p99_ms\n";
    for (const auto& r : runs) {
      csv << r["request_rate"] << "," << r["completed"] << "," << r["failed"] << "," << r["request_throughput"] << ","
          << r["output_throughput"] << "," << r["total_token_throughput"] << "," << r["goodput"] << ","
          << r["ttft"]["median_ms"] << "," << r["ttft"]["p99_ms"] << "," << r["tpot"]["median_ms"] << ","
          << r["tpot"]["p99_ms"] << "," << r["itl"]["p99_ms"] << "," << r["e2el"]["p99_ms"] << "\n";
    }
  }
  int failed = 0;
  for (const auto& r : runs) failed += r["failed"].get<int>();
  return failed == 0 ? 0 : 1;
}

}  // namespace inferd

// inferd-bench cpu --model GGUF|DIR [--threads N] [--cpu-weights as_stored|fp32] [--prompt-len 512]
//                  [--batches 1,4,16] [--gen 128] [--repeats 3] [--json FILE]
// Prompt processing: one request of --prompt-len random tokens and one output token, tokens over the time to it
// (llama-bench's pp). Decode: B requests of 16-token prompts generating --gen tokens each, all submitted at once,
// generated tokens after every request's first over the time from the last first token to the end (llama-bench's tg
// at B = 1, llama-batched-bench's S_TG at B > 1). Medians of --repeats rounds after one warm-up request.
#include "tools/cpu_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tools/bench_sink.h"

namespace inferd {
namespace {

struct Options {
  std::string model, cpu_weights = "as_stored", json_path;
  int32_t threads = 0, prompt_len = 512, gen = 128, repeats = 3;
  std::vector<int32_t> batches = {1, 4, 16};
};

Request RandomRequest(const Engine& engine, int32_t prompt_len, int32_t new_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(10, engine.model().config.vocab_size - 1);
  Request r;
  r.id = "cpu-bench-" + std::to_string(seed);
  for (int32_t i = 0; i < prompt_len; ++i) r.prompt.push_back(id(rng));
  r.sampling.temperature = 0;
  r.stopping.max_tokens = new_tokens;
  r.stopping.ignore_eos = true;
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int CpuBenchMain(int argc, char** argv) {
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (has && a == "--model") {
      o.model = argv[++i];
    } else if (has && a == "--cpu-weights") {
      o.cpu_weights = argv[++i];
    } else if (has && a == "--json") {
      o.json_path = argv[++i];
    } else if (has && a == "--threads") {
      o.threads = std::atoi(argv[++i]);
    } else if (has && a == "--prompt-len") {
      o.prompt_len = std::atoi(argv[++i]);
    } else if (has && a == "--gen") {
      o.gen = std::atoi(argv[++i]);
    } else if (has && a == "--repeats") {
      o.repeats = std::atoi(argv[++i]);
    } else if (has && a == "--batches") {
      o.batches.clear();
      for (absl::string_view b : absl::StrSplit(argv[++i], ',')) o.batches.push_back(std::atoi(std::string(b).c_str()));
    } else {
      o.model.clear();
      break;
    }
  }
  const bool batches_ok = !o.batches.empty() &&
                          std::all_of(o.batches.begin(), o.batches.end(), [](int32_t b) { return b >= 1 && b <= 256; });
  if (o.model.empty() || !batches_ok || o.prompt_len < 1 || o.gen < 2 || o.repeats < 1 || o.threads < 0) {
    std::fprintf(stderr,
                 "usage: inferd-bench cpu --model GGUF|DIR [--threads N] [--cpu-weights as_stored|fp32] "
                 "[--prompt-len N] [--batches 1,4,16 (1..256)] [--gen N (>= 2)] [--repeats N] [--json FILE]\n");
    return 2;
  }
  Config c;
  c.model.path = o.model;
  c.engine.backend = "cpu";
  c.engine.cpu_weights = o.cpu_weights;
  c.engine.num_threads = o.threads;
  c.scheduler.max_num_seqs = std::max(64, *std::max_element(o.batches.begin(), o.batches.end()));
  c.scheduler.max_num_batched_tokens = std::max(2048, o.prompt_len);
  c.scheduler.max_queue = 4096;
  auto engine = Engine::Create(c);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  Engine& e = **engine;
  uint32_t seed = 1;
  WaitOk(*SubmitOrExit(e, RandomRequest(e, 16, 16, seed++)));  // warm-up
  nlohmann::json out = {{"model", o.model}, {"cpu_weights", o.cpu_weights}, {"threads", o.threads}};
  std::vector<double> pp;
  for (int32_t round = 0; round < o.repeats; ++round) {
    const absl::Time t0 = absl::Now();
    auto sink = SubmitOrExit(e, RandomRequest(e, o.prompt_len, 1, seed++));
    WaitOk(*sink);
    pp.push_back(o.prompt_len / absl::ToDoubleSeconds(sink->times.front() - t0));
  }
  std::printf("model %s, cpu_weights %s, threads %d\n", o.model.c_str(), o.cpu_weights.c_str(), o.threads);
  std::printf("pp%-5d %10.1f tokens/s\n", o.prompt_len, Median(pp));
  out["pp"] = {{"prompt_len", o.prompt_len}, {"tokens_per_s", Median(pp)}};
  for (int32_t batch : o.batches) {
    std::vector<double> rates;
    for (int32_t round = 0; round < o.repeats; ++round) {
      std::vector<std::shared_ptr<BenchSink>> sinks;
      for (int32_t b = 0; b < batch; ++b) sinks.push_back(SubmitOrExit(e, RandomRequest(e, 16, o.gen, seed++)));
      for (auto& s : sinks) WaitOk(*s);
      absl::Time start = absl::InfinitePast(), end = absl::InfinitePast();
      int64_t tokens = 0;
      for (auto& s : sinks) {
        start = std::max(start, s->times.front());
        end = std::max(end, s->times.back());
      }
      for (auto& s : sinks) {
        for (absl::Time t : s->times) tokens += t > start;
      }
      rates.push_back(tokens / absl::ToDoubleSeconds(end - start));
    }
    std::printf("tg%-3d x%-3d %9.1f tokens/s\n", o.gen, batch, Median(rates));
    out["decode"].push_back({{"batch", batch}, {"gen", o.gen}, {"tokens_per_s", Median(rates)}});
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace inferd

// `inferd-bench speculative --model PATH [--backend cuda|cpu] [--prompts FILE] [--batches 1,64] [--max-tokens N]
//   [--methods ngram,suffix] [--spec-tokens K] [--forced] [--dtype auto|bfloat16|float16] [--tensor-parallel N]
//   [--repeats N] [--json FILE]`: each workload of FILE (tools/spec_prompts.json: a user message per prompt, rendered
// with the model's chat template) generated greedily without speculation, then with
// each method, in one process on the same backend, N rounds of all of it (tokens/s: the median of the rounds; the
// first round's tokens and counts). Batch 1 runs the prompts one after another; batch B submits B
// requests at once (the workload's prompts in turn). Reported: generated tokens/s, the speed-up over no speculation,
// the share of drafted tokens accepted and the tokens a draft added, and whether the tokens are the same: where a
// request's tokens differ from the run without speculation, the first difference must be at a position whose top-1
// margin (without speculation) is under 0.1, as two orders of summation may round a near-tie either way. With the
// config's defaults a step drafts while that pays at its batch size (speculative.adaptive, max_batch); --forced makes
// every step draft, to show what checking drafts costs and gains at each batch size.
//
// `--verify-cost [--load-format dummy] [--decode-context N] [--tensor-parallel N]`: the device time of a step checking
// 4 drafted tokens at batch 1 (1 + 4 rows) against a plain decode step, on one engine (a request of one repeated token
// drafts every step; one that opts out decodes plainly).
#include "tools/spec_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tools/bench_sink.h"

namespace inferd {
namespace {

struct Options {
  std::string model, prompts = "tools/spec_prompts.json", backend = "cuda", json_path, load_format = "auto";
  std::string dtype = "auto";
  std::vector<int32_t> batches = {1, 64};
  std::vector<std::string> methods = {"ngram", "suffix"};
  int32_t max_tokens = 256, spec_tokens = 4, decode_context = 512, tensor_parallel = 1;
  int32_t repeats = 1;  // rounds of every run; tokens/s is the median
  bool verify_cost = false;
  bool forced = false;  // every step drafts (speculative.adaptive off, max_batch 0); else the config's defaults
};

std::shared_ptr<BenchSink> Submit(Engine& engine, const std::vector<int32_t>& prompt, int32_t max_tokens,
                                  bool speculative = true) {
  static int serial = 0;
  Request r;
  r.id = "spec-" + std::to_string(serial++);
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.stopping.max_tokens = max_tokens;
  r.top_logprobs = 2;
  r.speculative = speculative;
  return SubmitOrExit(engine, std::move(r));
}

Config BaseConfig(const Options& o) {
  Config c;
  c.model.path = o.model;
  c.model.load_format = o.load_format;
  c.engine.backend = o.backend;
  c.engine.dtype = o.dtype;
  c.engine.tensor_parallel_size = o.tensor_parallel;
  c.scheduler.max_num_seqs = std::max(64, *std::max_element(o.batches.begin(), o.batches.end()));
  c.scheduler.max_num_batched_tokens = std::max(2048, c.scheduler.max_num_seqs);
  c.scheduler.max_queue = 4096;
  c.speculative.max_tokens = o.spec_tokens;
  return c;
}

struct RunResult {
  double tokens_per_s = 0;
  int64_t drafts = 0, drafted = 0, accepted = 0;
  std::vector<std::shared_ptr<BenchSink>> sinks;
};

// One batch size of one workload on an engine: batch 1 one prompt at a time (tokens/s over the decode, the first
// token's prefill left out), batch B all at once (generated tokens over the wall time from the first submission).
RunResult RunBatch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int32_t batch,
                   int32_t max_tokens) {
  RunResult r;
  const EngineStats before = engine.Stats();
  int64_t tokens = 0;
  double secs = 0;
  if (batch == 1) {
    for (const std::vector<int32_t>& p : prompts) {
      auto sink = Submit(engine, p, max_tokens);
      WaitOk(*sink);
      tokens += static_cast<int64_t>(sink->tokens.size()) - 1;
      secs += absl::ToDoubleSeconds(sink->times.back() - sink->times.front());
      r.sinks.push_back(sink);
    }
  } else {
    const absl::Time start = absl::Now();
    for (int32_t i = 0; i < batch; ++i) r.sinks.push_back(Submit(engine, prompts[i % prompts.size()], max_tokens));
    absl::Time end = start;
    for (auto& s : r.sinks) {
      WaitOk(*s);
      tokens += static_cast<int64_t>(s->tokens.size());
      end = std::max(end, s->times.back());
    }
    secs = absl::ToDoubleSeconds(end - start);
  }
  const EngineStats after = engine.Stats();
  r.tokens_per_s = secs > 0 ? tokens / secs : 0;
  r.drafts = after.spec_drafts - before.spec_drafts;
  r.drafted = after.spec_draft_tokens - before.spec_draft_tokens;
  r.accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
  return r;
}

// Requests whose tokens equal the reference's, positions compared, and first differences at a margin ≥ 0.1.
struct Agreement {
  int32_t same = 0, positions = 0, decided = 0;
};
Agreement Compare(const RunResult& want, const RunResult& got) {
  Agreement a;
  for (size_t i = 0; i < want.sinks.size() && i < got.sinks.size(); ++i) {
    const BenchSink &w = *want.sinks[i], &g = *got.sinks[i];
    size_t p = 0;
    while (p < w.tokens.size() && p < g.tokens.size() && w.tokens[p] == g.tokens[p]) ++p;
    a.positions += static_cast<int32_t>(p);
    if (p == w.tokens.size() && p == g.tokens.size()) {
      ++a.same;
      continue;
    }
    const TokenLogprob& lp = w.logprobs.at(std::min(p, w.logprobs.size() - 1));
    const double margin = lp.top.size() > 1 ? lp.top[0].logprob - lp.top[1].logprob : 1.0;
    if (margin >= 0.1) {
      ++a.decided;
      std::fprintf(stderr, "request %zu: tokens differ at %zu, where the top-1 margin is %.3f\n", i, p, margin);
    }
  }
  return a;
}

absl::StatusOr<std::vector<int32_t>> Tokenize(const Model& model, const std::string& message) {
  if (!model.chat_template) return model.tokenizer->Encode(message, /*add_special_tokens=*/true);
  ChatMessage user;
  user.role = "user";
  user.content = message;
  auto text = model.chat_template->Render({user});
  if (!text.ok()) return text.status();
  return model.tokenizer->Encode(*text, /*add_special_tokens=*/false);
}

int VerifyCost(const Options& o) {
  Config c = BaseConfig(o);
  c.speculative.method = "ngram";
  c.speculative.ngram_min = 1;
  c.speculative.max_tokens = 4;
  c.speculative.min_acceptance = 1e-6;  // keep drafting 4 whatever is kept
  c.speculative.max_batch = 0;
  auto engine = Engine::Create(c);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::mutex mu;
  std::vector<double> plain, verify;
  size_t verify_graphs = 0;  // verify steps replayed from a captured graph
  (*engine)->SetObservers(nullptr, [&](const StepRecord& s) {
    if (s.num_seqs != 1 || s.device_s <= 0) return;
    std::lock_guard<std::mutex> lock(mu);
    if (s.num_tokens == 1) plain.push_back(s.device_s);
    if (s.num_tokens == 5 && s.num_drafted == 4) {
      verify.push_back(s.device_s);
      verify_graphs += s.graph;
    }
  });
  const std::vector<int32_t> prompt(o.decode_context, 1000);
  for (int rep = 0; rep < 3; ++rep) {  // alternating, the first of each warming up
    WaitOk(*Submit(**engine, prompt, 128, /*speculative=*/false));
    WaitOk(*Submit(**engine, prompt, 128, /*speculative=*/true));
  }
  std::lock_guard<std::mutex> lock(mu);
  if (plain.empty() || verify.empty()) {
    std::fprintf(stderr, "no %s steps were seen\n", plain.empty() ? "plain" : "verify");
    return 1;
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double p = median(plain), v = median(verify);
  std::printf(
      "verify step (1 + 4 rows, batch 1, context %d): %.3f ms against a plain decode step's %.3f ms: %.3fx "
      "(medians of %zu and %zu steps; %zu verify steps replayed a graph)\n",
      o.decode_context, 1e3 * v, 1e3 * p, v / p, verify.size(), plain.size(), verify_graphs);
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << nlohmann::json{{"verify_step_ms", 1e3 * v},
                                                 {"decode_step_ms", 1e3 * p},
                                                 {"ratio", v / p},
                                                 {"verify_graph_steps", verify_graphs}}
                                      .dump(1)
                               << "\n";
  }
  return 0;
}

}  // namespace

int SpecMain(int argc, char** argv) {
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (has && a == "--model")
      o.model = argv[++i];
    else if (has && a == "--prompts")
      o.prompts = argv[++i];
    else if (has && a == "--backend")
      o.backend = argv[++i];
    else if (has && a == "--json")
      o.json_path = argv[++i];
    else if (has && a == "--load-format")
      o.load_format = argv[++i];
    else if (has && a == "--dtype")
      o.dtype = argv[++i];
    else if (has && a == "--max-tokens")
      o.max_tokens = std::atoi(argv[++i]);
    else if (has && a == "--spec-tokens")
      o.spec_tokens = std::atoi(argv[++i]);
    else if (has && a == "--decode-context")
      o.decode_context = std::atoi(argv[++i]);
    else if (has && a == "--tensor-parallel")
      o.tensor_parallel = std::atoi(argv[++i]);
    else if (has && a == "--repeats")
      o.repeats = std::atoi(argv[++i]);
    else if (a == "--verify-cost")
      o.verify_cost = true;
    else if (a == "--forced")
      o.forced = true;
    else if (has && a == "--methods")
      o.methods = absl::StrSplit(argv[++i], ',');
    else if (has && a == "--batches") {
      o.batches.clear();
      for (absl::string_view b : absl::StrSplit(argv[++i], ',')) o.batches.push_back(std::atoi(std::string(b).c_str()));
    } else {
      o.model.clear();
      break;
    }
  }
  if (o.model.empty() || o.batches.empty() || o.max_tokens < 1 || o.spec_tokens < 1 || o.spec_tokens > 16 ||
      o.tensor_parallel < 1 || o.repeats < 1) {
    std::fprintf(stderr,
                 "usage: inferd-bench speculative --model PATH [--backend cuda|cpu] [--prompts FILE] [--batches 1,64]\n"
                 "         [--max-tokens N] [--methods ngram,suffix] [--spec-tokens K (1..16)] [--forced] [--dtype D]\n"
                 "         [--tensor-parallel N] [--repeats N] [--json FILE]\n"
                 "       inferd-bench speculative --model PATH --verify-cost [--load-format dummy] "
                 "[--decode-context N] [--tensor-parallel N]\n");
    return 2;
  }
  if (o.verify_cost) return VerifyCost(o);
  std::ifstream f(o.prompts);
  const nlohmann::json spec = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object() || !spec.contains("workloads") || !spec["workloads"].is_object()) {
    std::fprintf(stderr, "%s: expected {\"workloads\": {NAME: [user message, ...], ...}}\n", o.prompts.c_str());
    return 2;
  }
  nlohmann::json out = {{"model", o.model},           {"backend", o.backend}, {"dtype", o.dtype},
                        {"max_tokens", o.max_tokens}, {"forced", o.forced},   {"runs", {}}};
  bool ok = true;
  std::vector<std::string> methods = {"off"};
  methods.insert(methods.end(), o.methods.begin(), o.methods.end());
  // Per (method, workload, batch): the first round's run (its counts and tokens) and every round's tokens/s. Rounds
  // run every method in turn, so a drift of the machine's speed reaches each method alike; the medians are compared.
  struct Cell {
    RunResult first;
    std::vector<double> rates;
  };
  std::map<std::tuple<std::string, std::string, int32_t>, Cell> cells;
  for (int32_t round = 0; round < o.repeats; ++round) {
    for (const std::string& method : methods) {
      Config c = BaseConfig(o);
      c.speculative.method = method;
      if (o.forced) {  // every step drafts, so the table shows what checking drafts does at each batch size
        c.speculative.max_batch = 0;
        c.speculative.adaptive = false;
      }
      for (const auto& [name, messages] : spec["workloads"].items()) {
        for (int32_t batch : o.batches) {
          // A fresh engine for each run: suffix decoding's cache of finished outputs would otherwise draft the
          // answers of prompts an earlier run already answered.
          auto engine = Engine::Create(c);
          if (!engine.ok()) {
            std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
            return 1;
          }
          std::vector<std::vector<int32_t>> prompts;
          for (const auto& m : messages) {
            auto ids = Tokenize((*engine)->model(), m.get<std::string>());
            if (!ids.ok()) {
              std::fprintf(stderr, "%s: %s\n", name.c_str(), ids.status().ToString().c_str());
              return 1;
            }
            prompts.push_back(*ids);
          }
          RunBatch(**engine, {std::vector<int32_t>(16, prompts[0][0])}, 1, 16);  // warm-up on a prompt of no workload
          RunResult r = RunBatch(**engine, prompts, batch, o.max_tokens);
          Cell& cell = cells[{method, name, batch}];
          cell.rates.push_back(r.tokens_per_s);
          if (round == 0) cell.first = std::move(r);
        }
      }
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("%-8s %5s %-7s %10s %8s %10s %12s %s\n", "workload", "batch", "method", "tok/s", "speed-up", "accepted",
              "tokens/draft", "same tokens");
  for (const std::string& method : methods) {
    for (const auto& [name, messages] : spec["workloads"].items()) {
      for (int32_t batch : o.batches) {
        const Cell& cell = cells.at({method, name, batch});
        const Cell& ref = cells.at({"off", name, batch});
        const RunResult& r = cell.first;
        const double rate = median(cell.rates);
        nlohmann::json row = {{"workload", name},
                              {"batch", batch},
                              {"method", method},
                              {"tokens_per_s", rate},
                              {"tokens_per_s_runs", cell.rates}};
        std::string same = "(reference)";
        double speedup = 1;
        if (method != "off") {
          const double ref_rate = median(ref.rates);
          speedup = ref_rate > 0 ? rate / ref_rate : 0;
          const Agreement a = Compare(ref.first, r);
          ok = ok && a.decided == 0;
          same = std::to_string(a.same) + "/" + std::to_string(r.sinks.size()) +
                 (a.decided ? " (" + std::to_string(a.decided) + " differ at a margin >= 0.1)" : "");
          row.update({{"speedup", speedup},
                      {"drafts", r.drafts},
                      {"draft_tokens", r.drafted},
                      {"accepted_tokens", r.accepted},
                      {"requests_same", a.same},
                      {"positions_same", a.positions},
                      {"decided_differences", a.decided}});
        }
        const double acceptance = r.drafted > 0 ? double(r.accepted) / r.drafted : 0;
        const double per_draft = r.drafts > 0 ? double(r.accepted) / r.drafts : 0;
        std::printf("%-8s %5d %-7s %10.1f %7.2fx %9.1f%% %12.2f %s\n", name.c_str(), batch, method.c_str(), rate,
                    speedup, 100 * acceptance, per_draft, same.c_str());
        out["runs"].push_back(row);
      }
    }
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(1) << "\n";
  return ok ? 0 : 1;
}

}  // namespace inferd

// `inferd-bench perplexity FILE`: how well a served model predicts a text, measured through the server. The text is
// tokenized by the server (in paragraph-aligned pieces, without special tokens), cut into windows of --window
// tokens, and each window is sent as one prompt with output.prompt_logprobs = 0: every token of a window but its
// first is scored given the tokens before it in the window. Perplexity = exp(mean negative log-likelihood) over all
// scored tokens. The per-window sums go to --json, so two runs (bf16 and fp8, say) compare window by window.
#include "tools/perplexity_bench.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "inferd/v1/inferd.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace inferd {
namespace {

namespace v1 = inferd::v1;

struct Options {
  std::string file;
  std::string address = "127.0.0.1:50051";
  int window = 1024;    // tokens a prompt; the first of each is context only
  int max_windows = 0;  // 0 = the whole text
  int max_concurrency = 8;
  std::string json_path;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    auto number = [&](int* v, int lo) { return has && absl::SimpleAtoi(argv[++i], v) && *v >= lo; };
    bool ok = true;
    if (a == "--address" && has) {
      o->address = argv[++i];
    } else if (a == "--window") {
      ok = number(&o->window, 2);
    } else if (a == "--max-windows") {
      ok = number(&o->max_windows, 0);
    } else if (a == "--max-concurrency") {
      ok = number(&o->max_concurrency, 1);
    } else if (a == "--json" && has) {
      o->json_path = argv[++i];
    } else if (a.rfind("--", 0) != 0 && o->file.empty()) {
      o->file = a;
    } else {
      return false;
    }
    if (!ok) return false;
  }
  return !o->file.empty();
}

// The text in pieces of about `bytes`, cut after a blank line where there is one (else a newline, else anywhere
// on a UTF-8 character boundary), so that no Tokenize request is large and few tokens straddle a cut.
std::vector<std::string> Pieces(const std::string& text, size_t bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = std::min(text.size(), pos + bytes);
    if (end < text.size()) {
      size_t cut = text.rfind("\n\n", end - 2);  // the blank line whole, in this piece
      size_t after = cut + 2;
      if (cut == std::string::npos || cut <= pos) {
        cut = text.rfind('\n', end - 1);
        after = cut + 1;
      }
      if (cut != std::string::npos && cut > pos) {
        end = after;
      } else {
        while (end > pos + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
    }
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

}  // namespace

int PerplexityMain(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: inferd-bench perplexity FILE [--address HOST:PORT] [--window TOKENS] [--max-windows N]\n"
                 "         [--max-concurrency N] [--json FILE]\n");
    return 2;
  }
  std::ifstream in(o.file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "perplexity: cannot read %s\n", o.file.c_str());
    return 2;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  auto stub = v1::Inference::NewStub(grpc::CreateChannel(o.address, grpc::InsecureChannelCredentials()));
  v1::ModelInfo model;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &model);
    if (!s.ok()) {
      std::fprintf(stderr, "perplexity: no inferd at %s: %s\n", o.address.c_str(), s.error_message().c_str());
      return 1;
    }
  }
  if (model.max_model_len() > 0 && o.window >= model.max_model_len()) {
    std::fprintf(stderr, "perplexity: --window %d does not fit the model's max_model_len %d (one token is generated)\n",
                 o.window, model.max_model_len());
    return 2;
  }
  std::vector<int32_t> tokens;
  for (const std::string& piece : Pieces(text, 64 << 10)) {
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text(piece);
    req.set_add_special_tokens(false);
    v1::TokenizeResponse resp;
    const grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "perplexity: Tokenize failed: %s\n", s.error_message().c_str());
      return 1;
    }
    tokens.insert(tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
  }
  int num_windows = static_cast<int>(tokens.size() / o.window);
  if (o.max_windows > 0) num_windows = std::min(num_windows, o.max_windows);
  if (num_windows == 0) {
    std::fprintf(stderr, "perplexity: %s is %zu tokens, shorter than one window of %d\n", o.file.c_str(), tokens.size(),
                 o.window);
    return 2;
  }

  // Windows in parallel, each one request; per window the summed negative log-likelihood of its scored tokens.
  std::vector<double> nll(num_windows, 0.0);
  std::vector<std::string> errors(num_windows);
  std::atomic<int> next{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < std::min(o.max_concurrency, num_windows); ++t) {
    workers.emplace_back([&] {
      for (int w = next++; w < num_windows; w = next++) {
        v1::GenerateRequest req;
        req.set_request_id("perplexity-" + std::to_string(w));
        auto* ids = req.mutable_token_ids();
        ids->mutable_ids()->Add(tokens.begin() + int64_t{w} * o.window, tokens.begin() + int64_t{w + 1} * o.window);
        req.mutable_sampling()->set_temperature(0);
        req.mutable_stopping()->set_max_tokens(1);
        req.mutable_stopping()->set_ignore_eos(true);
        req.mutable_output()->set_prompt_logprobs(0);
        grpc::ClientContext ctx;
        v1::GenerateResult result;
        const grpc::Status s = stub->Generate(&ctx, req, &result);
        if (!s.ok()) {
          errors[w] = s.error_message();
          continue;
        }
        if (result.prompt_logprobs_size() != o.window - 1) {
          errors[w] = "the server answered " + std::to_string(result.prompt_logprobs_size()) + " prompt logprobs";
          continue;
        }
        for (const v1::TokenLogprob& lp : result.prompt_logprobs()) nll[w] -= lp.logprob();
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int w = 0; w < num_windows; ++w) {
    if (!errors[w].empty()) {
      std::fprintf(stderr, "perplexity: window %d failed: %s\n", w, errors[w].c_str());
      return 1;
    }
  }
  const int64_t scored = int64_t{num_windows} * (o.window - 1);
  double total = 0;
  for (double v : nll) total += v;
  const double mean = total / static_cast<double>(scored);
  std::printf("perplexity of %s over %s: %d windows of %d tokens, %lld tokens scored (of %zu in the text)\n",
              model.name().c_str(), o.file.c_str(), num_windows, o.window, static_cast<long long>(scored),
              tokens.size());
  std::printf("  mean negative log-likelihood %.5f nats/token, perplexity %.4f\n", mean, std::exp(mean));
  std::printf("  %.2f s, %.0f prompt tokens/s\n", seconds, static_cast<double>(num_windows) * o.window / seconds);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", model.name()},   {"file", o.file},
                        {"window", o.window},      {"windows", num_windows},
                        {"tokens_scored", scored}, {"text_tokens", tokens.size()},
                        {"mean_nll", mean},        {"perplexity", std::exp(mean)},
                        {"seconds", seconds},      {"window_nll", nll}};
    std::ofstream(o.json_path) << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace inferd

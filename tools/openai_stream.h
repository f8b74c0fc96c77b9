// `inferd-bench serve --backend openai`: one streamed request through the OpenAI-compatible HTTP API (a blocking
// Boost.Beast client), timed as the gRPC client times its streams, and the served model's limits from /v1/models.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "inferd/v1/inferd.pb.h"

namespace inferd {

struct StreamTiming {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0, output_tokens = 0;
  double ttft = 0, latency = 0;
  std::vector<double> itl;  // seconds between consecutive chunks after the first
  bool started = false;     // a chunk with tokens has arrived

  // A chunk with tokens arrived at `now` (the request went out at `t0`): the first sets ttft, each later one
  // adds its gap since the one before.
  void Chunk(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point now) {
    if (!started) {
      ttft = std::chrono::duration<double>(now - t0).count();
      started = true;
    } else {
      itl.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
  }

 private:
  std::chrono::steady_clock::time_point last;
};

// token_ids and text prompts go to /v1/completions, messages to /v1/chat/completions; streamed with the usage.
StreamTiming RunOpenAiStream(const std::string& address, const v1::GenerateRequest& request);
// /v1/models' first model as a ModelInfo (name, max_model_len, vocab_size); false with `error` set when none.
bool OpenAiModelInfo(const std::string& address, v1::ModelInfo* model, std::string* error);

}  // namespace inferd

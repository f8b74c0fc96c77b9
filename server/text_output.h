// A request's text, made on the server's output writers from the token ids the engine sends: incremental
// detokenization that never splits a UTF-8 character, and stop strings that are never half-emitted. The engine
// stops on tokens (eos, stop token ids, max_tokens); a stop string found here is sent back to it
// (Engine::StopAt), and until it takes effect the engine's later tokens for the request are dropped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/chat/tool_calls.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"

namespace inferd {

// Stop strings are matched after every generated token: at most this many, of at most this many bytes.
constexpr int32_t kMaxStopStrings = 64;
constexpr int32_t kMaxStopStringBytes = 1024;

struct TextOptions {
  std::vector<std::string> stop;  // stop strings
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  int32_t min_tokens = 0;  // stop strings count from this many generated tokens on
  // The request offers tools the model may call: the front end finds the calls, written in this format, in the
  // text (engine/chat/tool_calls.h).
  std::optional<ToolCallFormat> tool_calls;
  // The model thinks in <think>…</think> (engine/chat/reasoning.h): the front end may split the reasoning from the
  // answer. The value: whether the prompt already opened it.
  std::optional<bool> reasoning;
};

class TextOutput {
 public:
  TextOutput(const Tokenizer* tokenizer, TextOptions options);

  // Makes the engine's next output for the request the client's and returns the text it releases. When a stop
  // string completes at one of its tokens, the tokens after it are dropped, and stopped_at() is set. Every later
  // output releases nothing; the engine's last (whatever ended it there) becomes finish = kStopString, OK, with
  // completion_tokens = stopped_at().
  std::string Take(RequestOutput* out);
  // The generated tokens the request ends with, once a stop string matched.
  std::optional<int32_t> stopped_at() const { return stopped_at_; }

 private:
  // One generated token, the num_output-th; true when a stop string completes with it.
  bool AddToken(int32_t token, int32_t num_output, std::string* text);
  // Text still held back (partial characters as U+FFFD, possible stop-string prefixes).
  std::string Flush();

  const Tokenizer* tokenizer_;
  TextOptions options_;
  std::string byte_run_;       // bytes of byte-fallback tokens in a row, not yet resolved
  std::string pending_bytes_;  // bytes of an unfinished UTF-8 character
  std::string held_text_;      // decoded text not yet released (may begin a stop string)
  std::optional<int32_t> stopped_at_;
};

}  // namespace inferd

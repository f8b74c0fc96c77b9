// Per-request output: incremental detokenization that never splits a UTF-8 character, and the stop
// conditions (eos, stop token ids, stop strings that are never half-emitted, min/max tokens).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"

namespace inferd {

class OutputProcessor {
 public:
  OutputProcessor(const Tokenizer* tokenizer, const Request* request, std::span<const int32_t> eos_ids);

  // Takes one generated token (num_output counts it) and returns the text that may be released now.
  // Sets *finish when the token ends the request.
  std::string Add(int32_t token, int32_t num_output, FinishReason* finish);
  // Text still held back (partial characters as U+FFFD, possible stop-string prefixes), released when
  // the request ends for another reason than a stop string.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  const Request* request_;
  std::vector<int32_t> eos_ids_;
  std::string pending_bytes_;  // bytes of an unfinished UTF-8 character
  std::string held_text_;      // decoded text not yet released (may begin a stop string)
};

}  // namespace inferd

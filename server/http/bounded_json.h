// Request bodies as JSON with their shape bounded before any value is built: a first pass over the text (nlohmann's
// SAX parser, which keeps its own stack and never recurses) counts nesting depth, values and object keys, and only a
// body inside every limit is parsed into values. So no body can exhaust the stack (a 100,000-deep `[[[…]]]`) or take
// far more memory than its size. Error messages quote values only through Preview: a short, escaped prefix.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace inferd {

struct JsonLimits {
  int max_depth = 32;            // arrays and objects inside each other; OpenAI requests need 5
  int64_t max_values = 1 << 20;  // every value (a 4 MiB list of token ids is under 1M)
  int64_t max_keys = 1 << 18;    // object members in all (logit_bias over a whole vocabulary fits)
};

// INVALID_ARGUMENT naming `what` and the limit passed, or the first syntax error's byte offset. Only one JSON value,
// with nothing after it but whitespace; a NUL byte anywhere is refused (nlohmann would read it as the end).
absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, const std::string& what,
                                                const JsonLimits& limits = {});

// At most `max_chars` of a value's JSON text (strings and containers cut before they are serialised, invalid UTF-8
// replaced), with "..." where it was cut: what an error message may show of a client's value.
std::string Preview(const nlohmann::json& value, size_t max_chars = 80);
// The same for text that is not JSON (a path, a model name): a JSON string literal of its first max_chars bytes.
std::string Preview(std::string_view text, size_t max_chars = 80);

}  // namespace inferd

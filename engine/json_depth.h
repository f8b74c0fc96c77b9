// How deep a JSON text nests its objects and arrays, counted before anything parses it: JSON that reaches inferd
// as text inside other text (a tool's schema or a call's arguments sent over gRPC, a model's own output) passes no
// request body's depth bound, and what is built from it (nlohmann's dump, the chat template's values, xgrammar's
// compiler) recurses once per level.
#pragma once

#include <algorithm>
#include <string_view>

namespace inferd {

// Walks text from `start` as JSON, calling at(i, depth) after each bracket outside strings (depth: how deep the
// text nests after it) until at returns true; returns that bracket's index, or npos.
template <typename At>
size_t JsonBrackets(std::string_view text, size_t start, At at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '{' || c == '[') ? at(i, ++depth) : (c == '}' || c == ']') && at(i, --depth)) {
      return i;
    }
  }
  return std::string_view::npos;
}

// Brackets inside strings are not counted; text that is not JSON is counted all the same.
inline int JsonDepth(std::string_view text) {
  int deepest = 0;
  JsonBrackets(text, 0, [&](size_t, int depth) {
    deepest = std::max(deepest, depth);
    return false;
  });
  return deepest;
}

// The end (one past) of the JSON object or array that starts at text[start], or npos when it does not close.
inline size_t JsonValueEnd(std::string_view text, size_t start) {
  const size_t close = JsonBrackets(text, start, [](size_t, int depth) { return depth == 0; });
  return close == std::string_view::npos ? close : close + 1;
}

// The deepest JSON text built into values here: as deep as a request body may nest (server/http/bounded_json.h).
constexpr int kMaxJsonTextDepth = 32;

}  // namespace inferd
